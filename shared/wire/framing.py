"""Length-prefixed framing: a 4-byte big-endian body length, then the body.

``FrameDecoder`` is sans-I/O: feed it bytes as they arrive and take out whole frame bodies.
"""

from __future__ import annotations

import struct

from shared.limits import FRAME_BYTES_MAX

LENGTH = struct.Struct(">I")
"""The length prefix of every frame."""
HEADER_BYTES = LENGTH.size
_LENGTH = LENGTH


def frame(body: bytes) -> bytes:
    assert len(body) <= FRAME_BYTES_MAX
    return _LENGTH.pack(len(body)) + body


class FrameTooBig(Exception):
    """The peer announced a frame over the limit: the stream cannot be trusted any more."""


class FrameDecoder:
    """Accumulates received bytes and yields complete frame bodies."""

    __slots__ = ("_buffer", "_frame_bytes_max")

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        self._buffer = bytearray()
        self._frame_bytes_max = frame_bytes_max

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return every frame body now complete. Raises ``FrameTooBig``."""
        self._buffer += data
        bodies: list[bytes] = []
        offset = 0
        buffer = self._buffer
        while len(buffer) - offset >= HEADER_BYTES:
            (length,) = _LENGTH.unpack_from(buffer, offset)
            if length > self._frame_bytes_max:
                raise FrameTooBig(f"frame of {length} bytes over {self._frame_bytes_max}")
            end = offset + HEADER_BYTES + length
            if end > len(buffer):
                break
            # Through a view: one copy of the body (slicing the bytearray itself makes two,
            # which for a 256 KiB batch is most of what receiving it costs in Python).
            with memoryview(buffer) as view:
                bodies.append(bytes(view[offset + HEADER_BYTES : end]))
            offset = end
        if offset:
            del buffer[:offset]
        return bodies
