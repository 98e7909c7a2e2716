"""Seqlog storage_node package."""
