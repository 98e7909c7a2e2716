"""Spark ingest of Seqlog's released records: the ``seqlog`` PySpark data source (batch and
streaming) and the ingest job behind ``seqlog ingest``.

Depends only on the public client (``seqlog``, plus ``shared`` which the client uses),
PySpark and pyarrow. ``register(spark)`` makes ``format("seqlog")`` known to a session.
"""

from spark_ingest.session import local_session, register
from spark_ingest.source import SOURCE_NAME, SeqlogDataSource

__all__ = ["SOURCE_NAME", "SeqlogDataSource", "local_session", "register"]
