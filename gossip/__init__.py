"""Seqlog gossip package."""
