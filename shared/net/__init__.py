"""Node-to-node asyncio transport: the only I/O in shared."""
