"""Epoch-store backends: memory (simulation) and file (embedded default)."""
