"""Seqlog's public Python client: ``from seqlog import Client``.

Depends only on ``shared`` plus aiohttp and msgpack, never on the node's own packages.
"""

from seqlog.buffered_writer import AppendHandle, BufferedWriter, WriterStats
from seqlog.client import Client
from seqlog.results import (
    AppendResult,
    BatchResult,
    ClusterInfo,
    Gap,
    NodeInfo,
    ReadResult,
    Record,
    TailResult,
)
from shared.status import LogError, Status

__all__ = [
    "AppendHandle",
    "AppendResult",
    "BatchResult",
    "BufferedWriter",
    "Client",
    "ClusterInfo",
    "Gap",
    "LogError",
    "NodeInfo",
    "ReadResult",
    "Record",
    "Status",
    "TailResult",
    "WriterStats",
]
