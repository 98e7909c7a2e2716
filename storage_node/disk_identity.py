"""The disk identity marker of a storage node: ``DATA/identity.json``.

Written once on a new disk (write, fsync, rename, fsync the directory) before anything else is
stored there, and checked at every start: cluster name, node id, the disk's generation (the
cluster-wide shard state, ``shared.cluster_state``, holds the same number) and when it was
created. What a start finds (``inspect``):

- ``OK``: the marker is this node's, in this cluster;
- ``NEW``: no marker and no segments: a new (or wiped) disk;
- ``LEGACY``: no marker, but segments (written before markers existed): the data is taken as
  this node's and a marker is written;
- ``DAMAGED``: a marker that cannot be read or parsed: the disk's history is unknown;
- ``FOREIGN``: the marker names another node or cluster. The node refuses to start on it:
  serving another node's copies as its own could give an LSN two answers, and only an
  operator can tell whether the disk should be wiped.

Whether a ``NEW`` or ``DAMAGED`` disk lost data that the cluster relies on is decided with the
cluster state (``storage_node.rebuild_runtime``): a shard the cluster knows by an older
generation had data, so the node comes up non-authoritative and is rebuilt.
Blocking: call from a thread or before the event loop serves traffic.
"""

from __future__ import annotations

import enum
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from shared.durable_files import replace_atomically

FILE_NAME = "identity.json"
FORMAT_VERSION = 1
SEGMENTS_DIR = "segments"


class DiskState(enum.Enum):
    OK = "OK"
    NEW = "NEW"
    LEGACY = "LEGACY"
    DAMAGED = "DAMAGED"
    FOREIGN = "FOREIGN"


@dataclass(frozen=True, slots=True)
class Marker:
    cluster: str
    node_id: str
    generation: int
    created_ms: int

    def document(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "cluster": self.cluster, "node_id": self.node_id,
                "generation": self.generation, "created_ms": self.created_ms}


@dataclass(frozen=True, slots=True)
class Inspection:
    state: DiskState
    marker: Marker | None = None
    detail: str = ""


class ForeignDiskError(RuntimeError):
    """The data directory belongs to another node or cluster."""


def parse(raw: bytes) -> Marker | None:
    """The marker in ``raw``; None when it is not a valid one."""
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if type(document) is not dict or document.get("format") != FORMAT_VERSION:
        return None
    cluster, node_id = document.get("cluster"), document.get("node_id")
    generation, created_ms = document.get("generation"), document.get("created_ms")
    if (type(cluster) is not str or type(node_id) is not str or not cluster or not node_id
            or type(generation) is not int or type(created_ms) is not int
            or not 0 < generation < 2**62 or not 0 <= created_ms < 2**62):
        return None
    return Marker(cluster, node_id, generation, created_ms)


def inspect(data_dir: str, *, cluster: str, node_id: str) -> Inspection:
    path = os.path.join(data_dir, FILE_NAME)
    try:
        with open(path, "rb") as file:
            raw = file.read()
    except FileNotFoundError:
        if _has_segments(data_dir):
            return Inspection(DiskState.LEGACY, detail="segments without an identity marker")
        return Inspection(DiskState.NEW, detail="no identity marker and no data")
    except OSError as error:
        return Inspection(DiskState.DAMAGED, detail=f"unreadable marker: {error}")
    marker = parse(raw)
    if marker is None:
        return Inspection(DiskState.DAMAGED, detail="malformed identity marker")
    if marker.cluster != cluster or marker.node_id != node_id:
        return Inspection(DiskState.FOREIGN, marker,
                          f"marker of node {marker.node_id!r} in cluster {marker.cluster!r}")
    return Inspection(DiskState.OK, marker)


def write(data_dir: str, marker: Marker) -> None:
    """Write ``marker`` durably (atomic replace). Raises OSError if it cannot."""
    os.makedirs(data_dir, exist_ok=True)
    replace_atomically(os.path.join(data_dir, FILE_NAME),
                       json.dumps(marker.document(), sort_keys=True).encode())


def new_marker(*, cluster: str, node_id: str, generation: int) -> Marker:
    return Marker(cluster, node_id, generation, time.time_ns() // 1_000_000)


def _has_segments(data_dir: str) -> bool:
    try:
        return any(name.endswith(".seg") for name in os.listdir(
            os.path.join(data_dir, SEGMENTS_DIR)))
    except OSError:
        return False
