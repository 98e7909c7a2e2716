"""Deterministic simulation of whole Seqlog clusters (VOPR-lite): pure cores wired together by
a seeded event loop, with faults derived from the seed and safety/liveness checkers."""
