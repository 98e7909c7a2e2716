"""The one place that turns wire messages into bytes and back (msgpack).

A frame body is the msgpack array ``[message_type, correlation_id, [field, ...]]`` with the
fields in dataclass order. Correlation id 0 marks a one-way message. Decoding checks every
field's type, so a malformed frame becomes ``Status.BADMSG`` instead of an exception deep in a
handler.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeAlias, Union

import msgpack

from shared.status import Status
from shared.wire.append import Append, Appended
from shared.wire.framing import frame
from shared.wire.hello import Hello, HelloReply
from shared.wire.message_type import RETIRED, MessageType
from shared.wire.read import GetLogState, LogState, Read, ReadReply
from shared.wire.release import Release
from shared.wire.store import Store, Stored

Message: TypeAlias = (
    Hello | HelloReply | Store | Stored | Release | Read | ReadReply | GetLogState | LogState
    | Append | Appended
)

MESSAGE_CLASSES: dict[MessageType, type[Any]] = {
    MessageType.HELLO: Hello,
    MessageType.HELLO_REPLY: HelloReply,
    MessageType.STORE: Store,
    MessageType.STORED: Stored,
    MessageType.RELEASE: Release,
    MessageType.READ: Read,
    MessageType.READ_REPLY: ReadReply,
    MessageType.GET_LOG_STATE: GetLogState,
    MessageType.LOG_STATE: LogState,
    MessageType.APPEND: Append,
    MessageType.APPENDED: Appended,
}
assert set(MESSAGE_CLASSES) == set(MessageType) - RETIRED

_TYPE_OF_CLASS: dict[type[Any], int] = {cls: int(t) for t, cls in MESSAGE_CLASSES.items()}

Converter = Callable[[Any], Any]


class _Invalid(Exception):
    pass


def _check(kind: type, optional: bool) -> Converter:
    def convert(value: Any) -> Any:
        if value is None and optional:
            return None
        if kind is Status:
            if type(value) is not int:
                raise _Invalid
            try:
                return Status(value)
            except ValueError:
                raise _Invalid from None
        if type(value) is not kind:
            raise _Invalid
        return value

    return convert


def _converter(hint: Any) -> Converter:
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        assert len(args) == 1, hint
        optional, hint = True, args[0]
    while hasattr(hint, "__supertype__"):  # NewType
        hint = hint.__supertype__
    origin = typing.get_origin(hint)
    if origin is tuple:
        return _check(tuple, optional)
    assert hint in (int, str, bytes, bool, Status), hint
    return _check(hint, optional)


_FIELDS: dict[type[Any], tuple[str, ...]] = {}
_CONVERTERS: dict[type[Any], tuple[Converter, ...]] = {}
for _cls in MESSAGE_CLASSES.values():
    _hints = typing.get_type_hints(_cls)
    _names = tuple(f.name for f in dataclasses.fields(_cls))
    _FIELDS[_cls] = _names
    _CONVERTERS[_cls] = tuple(_converter(_hints[n]) for n in _names)

_packer = msgpack.Packer(use_bin_type=True)


def encode(message: Message, correlation_id: int = 0) -> bytes:
    """The complete frame (length prefix included) for ``message``."""
    cls = type(message)
    fields = [getattr(message, name) for name in _FIELDS[cls]]
    return frame(_packer.pack((_TYPE_OF_CLASS[cls], correlation_id, fields)))


def decode(body: bytes) -> tuple[int, Message] | Status:
    """``(correlation_id, message)`` from a frame body, or ``Status.BADMSG``."""
    try:
        unpacked = msgpack.unpackb(body, raw=False, use_list=False, strict_map_key=True)
        type_id, correlation_id, fields = unpacked
        cls = MESSAGE_CLASSES[MessageType(type_id)]
        converters = _CONVERTERS[cls]
        if type(correlation_id) is not int or len(fields) != len(converters):
            return Status.BADMSG
        values = [conv(value) for conv, value in zip(converters, fields, strict=True)]
        return correlation_id, cls(**dict(zip(_FIELDS[cls], values, strict=True)))
    except (ValueError, TypeError, KeyError, _Invalid, msgpack.UnpackException):
        return Status.BADMSG
