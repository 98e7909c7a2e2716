"""The gossip failure detector: a pure core (``gossip.core``) and its asyncio driver."""
