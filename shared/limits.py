"""Hard limits that no configuration may exceed, with their relationships checked at import."""

from __future__ import annotations

FRAME_BYTES_MAX = 64 * 1024 * 1024
"""Largest node-to-node frame; a bigger length prefix means a desynced or hostile peer."""

PAYLOAD_BYTES_MAX_LIMIT = 32 * 1024 * 1024
"""Upper bound for the configurable per-record payload maximum."""

BATCH_RECORDS_MAX = 100_000
"""Most records one append-batch may carry."""

COMPRESSED_BATCH_PLAIN_BYTES_MAX = 2 * PAYLOAD_BYTES_MAX_LIMIT
"""Most payload bytes one compressed batch may expand to (the largest request body a plain
batch may have): storage nodes and readers expand stored batches within this bound."""

COPYSET_SIZE_MAX = 127
NODESET_SIZE_MAX = 127
KEY_BYTES_MAX = 4096
READ_RECORDS_MAX = 100_000
READ_WAIT_MS_MAX = 60_000
"""Longest a storage node holds a long-poll READ."""

PRODUCER_ID_BYTES_MAX = 256
"""Longest ``producer_id``; it names a writer, not data."""
PRODUCER_SEQ_MAX = 2**64 - 1
PRODUCER_SEQS_KEPT = 16
"""How many of a producer's latest appends to a log the cluster remembers (sequencers and
storage nodes alike): a retry of one of them returns its original LSNs; a retry of an older
one is refused with STALE. A producer must keep fewer appends than this in flight."""
PRODUCER_RANGES_PER_SEQ_MAX = 4
"""LSN ranges a storage node remembers for one producer's append (one ``producer_seq``): a
retry written again after recovery plugged the first copy leaves a stray copy of the first
range beside the record of the second, and the lookup needs both (the newest are kept)."""

assert PAYLOAD_BYTES_MAX_LIMIT < FRAME_BYTES_MAX
assert COPYSET_SIZE_MAX <= NODESET_SIZE_MAX
