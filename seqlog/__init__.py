"""Seqlog seqlog package."""
