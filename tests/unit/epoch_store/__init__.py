"""Unit tests of the epoch store."""
