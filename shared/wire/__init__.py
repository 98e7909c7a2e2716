"""Node-to-node wire messages, their permanent type ids, the codec and the framing."""
