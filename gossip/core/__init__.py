"""The failure detector's pure core: no I/O, no clock, no randomness of its own."""
