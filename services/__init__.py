"""Seqlog services package."""
