"""Pure core of sequencer/core."""
