"""Seqlog sequencer package."""
