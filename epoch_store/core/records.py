"""How the epoch store's two per-log objects are written down: plain JSON-compatible dicts.

Used by every persistent backend (file and ZooKeeper), so that the stored form is defined once.
Decoding treats the stored bytes as untrusted: anything that does not decode to a valid object
yields a reason string, never an exception.

The ZooKeeper backend adds one key, ``write_id``: a random id per write. A writer whose
connection dropped before the reply arrived re-reads the object and knows the write was its own
only if the stored bytes carry its id; two writers may otherwise store identical values (same
epoch, same ``last_writer``), and mistaking another's write for one's own would hand out an
epoch twice.
"""

from __future__ import annotations

import json
from typing import Any

from shared.epoch_metadata import NODESET_HISTORY_MAX, EpochNodeset, LastCleanEpoch, LogMetadata
from shared.limits import NODESET_SIZE_MAX
from shared.types import (
    EPOCH_MAX,
    EPOCH_MIN,
    Epoch,
    LogId,
    Lsn,
    NodeId,
    lsn_valid,
    node_id_valid,
)

FORMAT_VERSION = 1
"""Bumped when the stored layout changes incompatibly; readers refuse formats they lack."""

OBJECT_BYTES_MAX = 64 * 1024
"""Largest stored object we agree to parse (ZooKeeper's practical znode limit is far above a
127-node nodeset)."""


def _is_int(value: object) -> bool:
    return type(value) is int


def metadata_to_dict(value: LogMetadata) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "log_id": value.log_id,
        "next_epoch": value.next_epoch,
        "nodeset": list(value.nodeset),
        "replication_factor": value.replication_factor,
        "last_writer": value.last_writer,
        "version": value.version,
    }
    if value.nodeset_since != EPOCH_MIN or value.earlier:
        # Only a log whose nodeset changed stores these (older readers of the store never
        # see keys they do not know for logs that never changed).
        data["nodeset_since"] = value.nodeset_since
        data["earlier"] = [{"first_epoch": e.first_epoch, "nodeset": list(e.nodeset),
                            "replication_factor": e.replication_factor}
                           for e in value.earlier]
    return data


def lce_to_dict(value: LastCleanEpoch) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "log_id": value.log_id,
        "epoch": value.epoch,
        "tail_lsn": value.tail_lsn,
        "version": value.version,
    }


WRITE_ID_KEY = "write_id"


def with_write_id(data: dict[str, Any], write_id: str) -> dict[str, Any]:
    return {**data, WRITE_ID_KEY: write_id}


def without_write_id(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as the ``*_from_dict`` functions expect it (they reject unknown keys)."""
    return {k: v for k, v in data.items() if k != WRITE_ID_KEY}


def encode(data: dict[str, Any]) -> bytes:
    """Canonical bytes of a stored object (sorted keys, so equal objects store equal bytes)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def decode(raw: bytes) -> dict[str, Any] | str:
    """The dict stored in ``raw``, or why it is not one."""
    if len(raw) > OBJECT_BYTES_MAX:
        return f"object of {len(raw)} bytes exceeds {OBJECT_BYTES_MAX}"
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"not JSON: {exc}"
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("format") != FORMAT_VERSION:
        return f"unknown format {data.get('format')!r}"
    return data


def _common_problem(data: dict[str, Any], log_id: LogId, keys: frozenset[str]) -> str | None:
    if set(data) != keys:
        return f"keys {sorted(data)} differ from {sorted(keys)}"
    if data["log_id"] != log_id or not _is_int(data["log_id"]):
        return f"log_id {data['log_id']!r} stored under log {log_id}"
    if not _is_int(data["version"]) or data["version"] < 1:
        return f"bad version {data['version']!r}"
    return None


_METADATA_KEYS = frozenset(
    {"format", "log_id", "next_epoch", "nodeset", "replication_factor", "last_writer", "version"}
)
_LCE_KEYS = frozenset({"format", "log_id", "epoch", "tail_lsn", "version"})


_NODESET_KEYS = frozenset({"nodeset_since", "earlier"})
"""Optional metadata keys: present together, only once a log's nodeset changed."""


def _nodeset_problem(nodeset: Any, factor: Any) -> str | None:
    if not isinstance(nodeset, list) or not 0 < len(nodeset) <= NODESET_SIZE_MAX:
        return "bad nodeset"
    if not all(node_id_valid(n) for n in nodeset) or len(set(nodeset)) != len(nodeset):
        return "bad node id in nodeset"
    if not _is_int(factor) or not 1 <= factor <= len(nodeset):
        return f"bad replication_factor {factor!r}"
    return None


def _ranges_of(data: dict[str, Any], next_epoch: int
               ) -> tuple[Epoch, tuple[EpochNodeset, ...]] | str:
    """``nodeset_since`` and the earlier nodesets of ``data``, or why they are invalid."""
    if not _NODESET_KEYS & set(data):
        return Epoch(EPOCH_MIN), ()
    since, earlier = data["nodeset_since"], data["earlier"]
    if not _is_int(since) or not EPOCH_MIN <= since <= next_epoch:
        return f"bad nodeset_since {since!r}"
    if not isinstance(earlier, list) or len(earlier) > NODESET_HISTORY_MAX:
        return "bad earlier nodesets"
    ranges: list[EpochNodeset] = []
    bound = EPOCH_MIN
    for item in earlier:
        if not isinstance(item, dict) or set(item) != {"first_epoch", "nodeset",
                                                       "replication_factor"}:
            return "bad earlier nodeset"
        first = item["first_epoch"]
        if not _is_int(first) or not bound <= first < since or (not ranges and first != bound):
            return f"bad earlier first_epoch {first!r}"
        problem = _nodeset_problem(item["nodeset"], item["replication_factor"])
        if problem is not None:
            return f"earlier nodeset: {problem}"
        ranges.append(EpochNodeset(Epoch(first), tuple(NodeId(n) for n in item["nodeset"]),
                                   item["replication_factor"]))
        bound = first + 1
    if ranges == [] and since != EPOCH_MIN:
        return f"nodeset_since {since} without earlier nodesets"
    return Epoch(since), tuple(ranges)


def metadata_from_dict(data: dict[str, Any], log_id: LogId) -> LogMetadata | str:
    """The metadata of ``log_id`` in ``data``, or why ``data`` is not valid metadata."""
    keys = _METADATA_KEYS | _NODESET_KEYS if _NODESET_KEYS & set(data) else _METADATA_KEYS
    problem = _common_problem(data, log_id, keys)
    if problem is not None:
        return problem
    next_epoch, nodeset = data["next_epoch"], data["nodeset"]
    factor, writer = data["replication_factor"], data["last_writer"]
    if not _is_int(next_epoch) or not EPOCH_MIN <= next_epoch <= EPOCH_MAX:
        return f"bad next_epoch {next_epoch!r}"
    problem = _nodeset_problem(nodeset, factor)
    if problem is not None:
        return problem
    if writer is not None and not node_id_valid(writer):
        return f"bad last_writer {writer!r}"
    ranges = _ranges_of(data, next_epoch)
    if isinstance(ranges, str):
        return ranges
    return LogMetadata(
        log_id=log_id,
        next_epoch=Epoch(next_epoch),
        nodeset=tuple(NodeId(n) for n in nodeset),
        replication_factor=factor,
        last_writer=None if writer is None else NodeId(writer),
        version=data["version"],
        nodeset_since=ranges[0],
        earlier=ranges[1],
    )


def lce_from_dict(data: dict[str, Any], log_id: LogId) -> LastCleanEpoch | str:
    """The last clean epoch of ``log_id`` in ``data``, or why ``data`` is not one."""
    problem = _common_problem(data, log_id, _LCE_KEYS)
    if problem is not None:
        return problem
    epoch, tail_lsn = data["epoch"], data["tail_lsn"]
    if not _is_int(epoch) or not EPOCH_MIN <= epoch <= EPOCH_MAX:
        return f"bad epoch {epoch!r}"
    if not lsn_valid(tail_lsn):
        return f"bad tail_lsn {tail_lsn!r}"
    return LastCleanEpoch(
        log_id=log_id, epoch=Epoch(epoch), tail_lsn=Lsn(tail_lsn), version=data["version"]
    )
