"""Hard limits that no configuration may exceed, with their relationships checked at import."""

from __future__ import annotations

FRAME_BYTES_MAX = 64 * 1024 * 1024
"""Largest node-to-node frame; a bigger length prefix means a desynced or hostile peer."""

PAYLOAD_BYTES_MAX_LIMIT = 32 * 1024 * 1024
"""Upper bound for the configurable per-record payload maximum."""

BATCH_RECORDS_MAX = 100_000
"""Most records one append-batch may carry."""

COPYSET_SIZE_MAX = 127
NODESET_SIZE_MAX = 127
KEY_BYTES_MAX = 4096
READ_RECORDS_MAX = 100_000
READ_WAIT_MS_MAX = 60_000
"""Longest a storage node holds a long-poll READ."""

assert PAYLOAD_BYTES_MAX_LIMIT < FRAME_BYTES_MAX
assert COPYSET_SIZE_MAX <= NODESET_SIZE_MAX
