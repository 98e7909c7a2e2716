"""Pure core of storage_node/core."""
