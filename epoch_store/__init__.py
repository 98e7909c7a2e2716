"""Seqlog epoch_store package."""
