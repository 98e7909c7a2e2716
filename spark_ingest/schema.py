"""The columns of a ``seqlog`` DataFrame and the Arrow schema its batches must match.

Every row is a released record: ``log_id``, ``lsn``, ``epoch``, ``esn``, ``timestamp``,
``key``, ``payload``. With ``includeGaps`` a row may instead stand for a gap (``gap_type`` set,
``lsn .. gap_last_lsn`` its LSNs, no payload). With ``payloadFormat`` json or msgpack the
fields of ``payloadSchema`` follow as columns of their own.

``DataSource.schema()`` runs in a Python process without a JVM, where Spark's DDL parser is not
available, so the schema goes to Spark as a DDL string and the readers check the parsed
``StructType`` that Spark hands back (also when a user gave a schema of their own).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.types import (
    BinaryType,
    DataType,
    LongType,
    StringType,
    StructType,
    TimestampType,
)

from spark_ingest.options import SourceOptions

RECORD_COLUMNS: tuple[tuple[str, DataType], ...] = (
    ("log_id", LongType()),
    ("lsn", LongType()),
    ("epoch", LongType()),
    ("esn", LongType()),
    ("timestamp", TimestampType()),
    ("key", StringType()),
    ("payload", BinaryType()),
)
GAP_COLUMNS: tuple[tuple[str, DataType], ...] = (
    ("gap_type", StringType()),
    ("gap_last_lsn", LongType()),
)
_DDL_TYPES: dict[DataType, str] = {
    LongType(): "bigint", TimestampType(): "timestamp", StringType(): "string",
    BinaryType(): "binary",
}


def schema_ddl(options: SourceOptions) -> str:
    """The DataFrame's schema as Spark DDL (what ``DataSource.schema()`` returns)."""
    columns = [*RECORD_COLUMNS, *(GAP_COLUMNS if options.include_gaps else ())]
    ddl = ", ".join(f"`{name}` {_DDL_TYPES[kind]}" for name, kind in columns)
    if options.payload_schema:
        ddl += ", " + options.payload_schema
    return ddl


@dataclass(frozen=True, slots=True)
class Layout:
    """Which column of the Spark schema is what: the reader builds each by name."""

    schema: StructType
    decoded: tuple[str, ...]
    """Columns filled from the decoded payload's fields of the same name."""
    gaps: bool


def layout(schema: StructType, options: SourceOptions) -> Layout:
    """Checks a schema (ours or the user's) against the options; ValueError if it cannot work."""
    expected = dict(RECORD_COLUMNS)
    gap_types = dict(GAP_COLUMNS)
    decoded: list[str] = []
    seen: set[str] = set()
    for field in schema.fields:
        if field.name in seen:
            raise ValueError(f"column {field.name!r} appears twice in the schema; payloadSchema "
                             "fields must not reuse the names of the record columns "
                             f"({', '.join(expected)}) or of the gap columns")
        seen.add(field.name)
        if field.name in expected or field.name in gap_types:
            want = expected.get(field.name) or gap_types[field.name]
            if field.dataType != want:
                raise ValueError(f"column {field.name!r} must be {want.simpleString()}, not "
                                 f"{field.dataType.simpleString()}")
        else:
            decoded.append(field.name)
    if decoded and options.payload_format == "binary":
        raise ValueError(f"columns {decoded} are not record columns; set payloadFormat to json "
                         "or msgpack to fill them from the payload")
    has_gaps = [name for name in gap_types if name in seen]
    if has_gaps and not options.include_gaps:
        raise ValueError(f"columns {has_gaps} need the option includeGaps=true")
    if options.include_gaps and len(has_gaps) != len(gap_types):
        raise ValueError(f"includeGaps=true needs the columns {list(gap_types)}")
    return Layout(schema=schema, decoded=tuple(decoded), gaps=options.include_gaps)
