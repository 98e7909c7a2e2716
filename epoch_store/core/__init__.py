"""Pure core of epoch_store/core."""
