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


BIG_FRAME_BYTES_MIN = 64 * 1024
"""A frame at least this big that arrives over several reads is gathered as a list of the
reads and joined once when complete, instead of being appended to the buffer read by read
(which copies it, and again whenever the buffer grows) and then copied out of it: one copy of
a 1 MiB batch instead of two or three, in every process that receives one."""


class FrameDecoder:
    """Accumulates received bytes and yields complete frame bodies."""

    __slots__ = ("_big_bytes_min", "_buffer", "_frame_bytes_max", "_missing", "_parts")

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX, *,
                 big_frame_bytes_min: int = BIG_FRAME_BYTES_MIN) -> None:
        self._buffer = bytearray()
        """Received bytes not yet part of a complete frame (unless gathering a big one)."""
        self._frame_bytes_max = frame_bytes_max
        self._big_bytes_min = big_frame_bytes_min
        self._parts: list[bytes] = []
        """The big frame being gathered: its body so far, one item per read."""
        self._missing = 0
        """Bytes the big frame being gathered still lacks (0: none is being gathered)."""

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return every frame body now complete. Raises ``FrameTooBig``."""
        bodies: list[bytes] = []
        missing = self._missing
        if missing:
            if len(data) < missing:
                self._parts.append(data)
                self._missing = missing - len(data)
                return bodies
            parts = self._parts
            parts.append(data if len(data) == missing else data[:missing])
            bodies.append(b"".join(parts))
            self._parts = []
            self._missing = 0
            if len(data) == missing:
                return bodies
            data = data[missing:]
        buffer = self._buffer
        source: bytes | bytearray
        if buffer:
            buffer += data
            source = buffer
        else:
            source = data  # frames read whole are cut straight out of the read
        size = len(source)
        offset = 0
        while size - offset >= HEADER_BYTES:
            (length,) = _LENGTH.unpack_from(source, offset)
            if length > self._frame_bytes_max:
                raise FrameTooBig(f"frame of {length} bytes over {self._frame_bytes_max}")
            end = offset + HEADER_BYTES + length
            if end > size:
                if length >= self._big_bytes_min:
                    with memoryview(source) as view:
                        self._parts = [bytes(view[offset + HEADER_BYTES:])]
                    self._missing = end - size
                    offset = size
                break
            # Through a view: one copy of the body (slicing a bytearray itself makes two).
            with memoryview(source) as view:
                bodies.append(bytes(view[offset + HEADER_BYTES : end]))
            offset = end
        if source is buffer:
            if offset:
                del buffer[:offset]
        elif offset < size:
            buffer += data[offset:]
        return bodies
