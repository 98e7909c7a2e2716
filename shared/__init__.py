"""Seqlog's shared vocabulary: ids, statuses, wire messages, framing and configuration."""
