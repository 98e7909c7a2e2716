"""The one place that turns wire messages into bytes and back (msgpack).

A frame body is the msgpack array ``[message_type, correlation_id, [field, ...]]`` with the
fields in dataclass order. Correlation id 0 marks a one-way message. Decoding checks every
field's type, so a malformed frame becomes ``Status.BADMSG`` instead of an exception deep in a
handler.

Compatibility between node versions: a message gains fields only at its end, with defaults,
marked ``shared.wire.extension``. Trailing extension fields that hold their default are not
sent, and a decoder fills in those missing at the end with their defaults, so a
node that does not use a new field talks to one that does not know it, byte for byte as
before. A frame with more fields than this build knows is
refused (BADMSG), never cut short: a new field may change what the others mean (a compressed
batch's ``payloads`` hold one blob), so dropping it could store or serve wrong records. Fields
added after protocol version 1 are also marked ``shared.wire.extension`` (docs/PROTOCOL.md).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeAlias, Union

import msgpack

from shared.limits import FRAME_BYTES_MAX
from shared.status import Status
from shared.wire.append import Append, Appended, GetSequencerState, SequencerState
from shared.wire.append_multi import AppendedMulti, AppendMulti
from shared.wire.framing import LENGTH as _LENGTH
from shared.wire.gossip import Gossip
from shared.wire.hello import Auth, Hello, HelloReply
from shared.wire.message_type import RETIRED, MessageType
from shared.wire.producer import GetProducer, ProducerState
from shared.wire.read import GetLogState, LogState, Read, ReadReply
from shared.wire.rebuild import RebuildStore, RebuildStored
from shared.wire.recovery import Clean, Cleaned, Digest, GetDigest, Seal, Sealed
from shared.wire.release import Release
from shared.wire.store import Store, Stored
from shared.wire.store_batch import (
    STORE_BATCH_STORES_MAX,
    ReleaseBatch,
    StoreBatch,
    StoredBatch,
)
from shared.wire.trim import FindTime, FoundTime, Trim, Trimmed

Message: TypeAlias = (
    Hello | HelloReply | Store | Stored | Release | Read | ReadReply | GetLogState | LogState
    | Append | Appended | GetSequencerState | SequencerState | Gossip | Seal | Sealed
    | GetDigest | Digest | Clean | Cleaned | Trim | Trimmed | FindTime | FoundTime
    | GetProducer | ProducerState | StoreBatch | StoredBatch
    | ReleaseBatch | Auth
    | RebuildStore | RebuildStored | AppendMulti | AppendedMulti
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
    MessageType.GET_SEQUENCER_STATE: GetSequencerState,
    MessageType.SEQUENCER_STATE: SequencerState,
    MessageType.GOSSIP: Gossip,
    MessageType.SEAL: Seal,
    MessageType.SEALED: Sealed,
    MessageType.GET_DIGEST: GetDigest,
    MessageType.DIGEST: Digest,
    MessageType.CLEAN: Clean,
    MessageType.CLEANED: Cleaned,
    MessageType.TRIM: Trim,
    MessageType.TRIMMED: Trimmed,
    MessageType.FIND_TIME: FindTime,
    MessageType.FOUND_TIME: FoundTime,
    MessageType.GET_PRODUCER: GetProducer,
    MessageType.PRODUCER_STATE: ProducerState,
    MessageType.STORE_BATCH: StoreBatch,
    MessageType.STORED_BATCH: StoredBatch,
    MessageType.RELEASE_BATCH: ReleaseBatch,
    MessageType.AUTH: Auth,
    MessageType.REBUILD_STORE: RebuildStore,
    MessageType.REBUILD_STORED: RebuildStored,
    MessageType.APPEND_MULTI: AppendMulti,
    MessageType.APPENDED_MULTI: AppendedMulti,
}
assert set(MESSAGE_CLASSES) == set(MessageType) - RETIRED

_TYPE_OF_CLASS: dict[type[Any], int] = {cls: int(t) for t, cls in MESSAGE_CLASSES.items()}

class _Invalid(Exception):
    pass


_STATUS_BY_VALUE: dict[int, Status] = {int(status): status for status in Status}


def _status(value: Any) -> Status:
    if type(value) is not int:
        raise _Invalid
    status = _STATUS_BY_VALUE.get(value)
    if status is None:
        raise _Invalid
    return status


def _field_check(name: str, hint: Any) -> str:
    """Python source that checks (and for Status converts) local variable ``name``."""
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        assert len(args) == 1, hint
        optional, hint = True, args[0]
    while hasattr(hint, "__supertype__"):  # NewType
        hint = hint.__supertype__
    if typing.get_origin(hint) is tuple:
        hint = tuple
    assert hint in (int, str, bytes, bool, tuple, Status), hint
    none_ok = f"{name} is not None and " if optional else ""
    if hint is Status:
        return f"    if {none_ok}True: {name} = _status({name})\n"
    return f"    if {none_ok}type({name}) is not {hint.__name__}: raise _Invalid\n"


def _wire_fields(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    """The fields of message class ``cls`` that travel, in wire order (a field with
    ``metadata={"wire": False}`` is local only, such as ``Store.wire_fields``)."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("wire", True)]


def wire_field_names(cls: type[Any]) -> tuple[str, ...]:
    """The names of ``cls``'s fields that travel, in wire order."""
    return tuple(f.name for f in _wire_fields(cls))


def _slot_setter(cls: type[Any], name: str) -> Callable[[Any, Any], None]:
    """The ``__set__`` of ``cls``'s slot ``name`` (message classes are slotted dataclasses
    without ``__post_init__``, so setting every slot is all their ``__init__`` does)."""
    descriptor = cls.__dict__[name]
    assert isinstance(descriptor, types.MemberDescriptorType), (cls, name)
    assert not hasattr(cls, "__post_init__"), cls
    setter: Callable[[Any, Any], None] = descriptor.__set__
    return setter


def _default_of(field: dataclasses.Field[Any]) -> Any:
    assert field.default is not dataclasses.MISSING, (
        f"local field {field.name} needs a plain default")
    return field.default


def _make_decoder(cls: type[Any]) -> Callable[[Any], Any]:
    """A function that checks a field tuple and builds ``cls`` from it: generated source, so
    that decoding costs no per-field function calls (it runs for every frame)."""
    hints = typing.get_type_hints(cls)
    names = list(wire_field_names(cls))
    source = "def decode_fields(fields):\n"
    tail = _EXTENSION_TAILS[cls]
    if tail:
        # An older sender (or one leaving extensions at their defaults out) sends fewer
        # fields: fill them in; a frame short of a version-1 field stays invalid.
        source += (f"    if {len(names) - len(tail)} <= len(fields) < {len(names)}: "
                   f"fields = fields + _tail[len(fields) - {len(names)}:]\n")
    source += f"    ({', '.join(names)},) = fields\n"
    source += "".join(_field_check(name, hints[name]) for name in names)
    # Built without the frozen dataclass's __init__ (one object.__setattr__ call per field):
    # each slot is set through its descriptor, which costs a quarter as much. The message
    # stays immutable to everyone else. Local-only fields get their defaults.
    namespace: dict[str, Any] = {"cls": cls, "_status": _status, "_Invalid": _Invalid,
                                 "_tail": tail, "_new": object.__new__}
    source += "    _m = _new(cls)\n"
    for index, field in enumerate(dataclasses.fields(cls)):
        namespace[f"_set{index}"] = _slot_setter(cls, field.name)
        if field.name in names:
            source += f"    _set{index}(_m, {field.name})\n"
        else:
            namespace[f"_default{index}"] = _default_of(field)
            source += f"    _set{index}(_m, _default{index})\n"
    source += "    return _m\n"
    exec(source, namespace)
    decoder: Callable[[Any], Any] = namespace["decode_fields"]
    return decoder


def _extension_count(cls: type[Any]) -> int:
    """How many trailing fields of ``cls`` are extensions (``shared.wire.extension``)."""
    fields = _wire_fields(cls)
    count = 0
    while count < len(fields) and fields[len(fields) - 1 - count].metadata.get("extension"):
        count += 1
    assert not any(f.metadata.get("extension") for f in fields[:len(fields) - count]), (
        f"{cls.__name__}: extension fields must come last")
    return count


_FIELDS: dict[type[Any], tuple[str, ...]] = {
    cls: wire_field_names(cls) for cls in MESSAGE_CLASSES.values()
}
_EXTENSION_TAILS: dict[type[Any], tuple[Any, ...]] = {
    cls: tuple(f.default for f in _wire_fields(cls)[
        len(_FIELDS[cls]) - _extension_count(cls):]) for cls in MESSAGE_CLASSES.values()
}
"""The defaults of each class's trailing extension fields: only these are left off the wire
at their defaults, so a frame without extensions is what a version-1 peer sends and expects
(it decodes exactly its own fields)."""
_DECODERS: dict[int, Callable[[Any], Any]] = {
    int(t): _make_decoder(cls) for t, cls in MESSAGE_CLASSES.items()
}
# Its one field holds STOREs, which the generated decoder would leave as raw tuples.
_DECODERS[int(MessageType.STORE_BATCH)] = lambda fields: _store_batch_from_fields(fields)

_packer = msgpack.Packer(use_bin_type=True)


def encode(message: Message, correlation_id: int = 0) -> bytes:
    """The complete frame (length prefix included) for ``message``."""
    return b"".join(encode_parts(message, encode_fields(message), correlation_id))


def _make_field_lister(cls: type[Any]) -> Callable[[Any], list[Any]]:
    """A function that lists ``cls``'s field values, leaving out trailing fields that hold
    their default (see the module docstring): generated source, as for decoding, because it
    runs for every message sent."""
    names = _FIELDS[cls]
    tail = _EXTENSION_TAILS[cls]
    required = len(names) - len(tail)
    source = "def list_fields(m):\n"
    source += f"    values = [{', '.join(f'm.{n}' for n in names)}]\n"
    if tail:
        indent = "    "
        for index in range(len(names) - 1, required - 1, -1):
            source += f"{indent}if values[{index}] == _tail[{index - required}]:\n"
            indent += "    "
            source += f"{indent}end = {index}\n"
        source = source.replace("    if values", "    end = -1\n    if values", 1)
        source += "    if end >= 0: del values[end:]\n"
    source += "    return values\n"
    namespace: dict[str, Any] = {"_tail": tail}
    exec(source, namespace)
    lister: Callable[[Any], list[Any]] = namespace["list_fields"]
    return lister


_LISTERS: dict[type[Any], Callable[[Any], list[Any]]] = {
    cls: _make_field_lister(cls) for cls in MESSAGE_CLASSES.values()
}


def encode_fields(message: Message) -> bytes:
    """The packed field array of ``message``: the bulk of a frame, the same for every peer it
    goes to, so a message sent to R nodes is packed once."""
    if type(message) is StoreBatch:
        return b"".join(_store_batch_field_parts(message))
    packed: bytes = _packer.pack(_LISTERS[type(message)](message))
    return packed


def _store_batch_field_parts(batch: StoreBatch) -> tuple[bytes, ...]:
    """A STORE_BATCH's field array as parts: its head, then each STORE's packed fields (as
    the sender packed them once for all the nodes they go to, or packed here)."""
    packed = batch.packed
    if packed is None:
        packed = tuple(_packer.pack(_LISTERS[Store](store)) for store in batch.stores)
    # A fixarray of the one field, then the array of STOREs.
    return (b"\x91" + _packer.pack_array_header(len(packed)), *packed)


def encode_store_batch_parts(batch: StoreBatch, correlation_id: int) -> tuple[bytes, ...]:
    """The frame of ``batch`` as parts for a vectored write, its STOREs' packed fields not
    copied (``encode_parts`` for a STORE_BATCH)."""
    head, *stores = _store_batch_field_parts(batch)
    header = b"\x93" + _packer.pack(_STORE_BATCH_TYPE_ID) + _packer.pack(correlation_id) + head
    length = len(header) + sum(map(len, stores))
    assert length <= FRAME_BYTES_MAX, length
    return (_LENGTH.pack(length) + header, *stores)


def encode_parts(
    message: Message, fields_packed: bytes, correlation_id: int
) -> tuple[bytes, bytes]:
    """The frame of ``message`` as (length prefix and header, packed fields), for vectored
    writes. A fixarray of 3 is 0x93 followed by its elements, so this is byte for byte what
    packing ``[type, correlation id, fields]`` gives."""
    header = b"\x93" + _packer.pack(_TYPE_OF_CLASS[type(message)]) + _packer.pack(
        correlation_id)
    length = len(header) + len(fields_packed)
    assert length <= FRAME_BYTES_MAX, length
    return _LENGTH.pack(length) + header, fields_packed


def decode(body: bytes) -> tuple[int, Message] | Status:
    """``(correlation_id, message)`` from a frame body, or ``Status.BADMSG``. A STORE keeps
    its packed fields (``Store.wire_fields``) when they can be cut out of the body."""
    try:
        if len(body) > 2 and body[0] == 0x93 and body[1] == _STORE_BATCH_TYPE_ID:
            return _decode_store_batch(body)
        unpacked = msgpack.unpackb(body, raw=False, use_list=False, strict_map_key=True)
        type_id, correlation_id, fields = unpacked
        decoder = _DECODERS.get(type_id)
        if decoder is None or type(correlation_id) is not int or type(fields) is not tuple:
            return Status.BADMSG
        message = decoder(fields)
        # Kept only when it holds no field this node does not know (the storage node writes
        # these bytes and reads them back with its own field list).
        if type_id == _STORE_TYPE_ID and len(fields) <= _STORE_FIELDS_COUNT:
            offset = _fields_offset(body)
            if offset is not None:
                # A view, not a copy: a batch's 1 MiB is written from the received frame.
                object.__setattr__(message, "wire_fields", memoryview(body)[offset:])
        return correlation_id, message
    except (ValueError, TypeError, KeyError, _Invalid, msgpack.UnpackException):
        return Status.BADMSG


def decode_store_fields(packed: bytes | memoryview) -> Store | Status:
    """A STORE from its packed field array (what ``encode_fields`` makes and a segment entry
    holds), keeping those bytes as ``wire_fields``; BADMSG if it is not one."""
    body = b"\x93" + _packer.pack(_STORE_TYPE_ID) + b"\x00" + bytes(packed)
    decoded = decode(body)
    if isinstance(decoded, Status) or type(decoded[1]) is not Store:
        return Status.BADMSG
    return decoded[1]


_STORE_TYPE_ID = int(MessageType.STORE)
_STORE_FIELDS_COUNT = len(_FIELDS[Store])
_STORE_BATCH_TYPE_ID = int(MessageType.STORE_BATCH)
assert _STORE_BATCH_TYPE_ID < 0x80  # a positive fixint: its frames start 0x93, type


def _store_batch_stores(stores: Any) -> list[tuple[Any, ...]]:
    """The field tuples of a STORE_BATCH's STOREs, checked for shape (not yet for types)."""
    if type(stores) is not tuple or not 0 < len(stores) <= STORE_BATCH_STORES_MAX:
        raise _Invalid
    for fields in stores:
        # More fields than this build knows: refused, as for a STORE (module docstring).
        if type(fields) is not tuple or len(fields) > _STORE_FIELDS_COUNT:
            raise _Invalid
    return list(stores)


def _store_batch_from_fields(fields: Any) -> StoreBatch:
    """A STORE_BATCH from its unpacked fields (any legal encoding; no ``wire_fields``)."""
    (stores,) = fields
    decode_store = _DECODERS[_STORE_TYPE_ID]
    return StoreBatch(stores=tuple(decode_store(f) for f in _store_batch_stores(stores)))


def _decode_store_batch(body: bytes) -> tuple[int, StoreBatch]:
    """A STORE_BATCH frame body, each STORE keeping its packed fields as a view of ``body``
    (``Store.wire_fields``: the storage node writes those bytes): read with a streaming
    unpacker, which tells where each STORE starts and ends."""
    unpacker = msgpack.Unpacker(raw=False, use_list=False, strict_map_key=True,
                                max_buffer_size=len(body))
    unpacker.feed(body)
    if unpacker.read_array_header() != 3:
        raise _Invalid
    type_id = unpacker.unpack()
    correlation_id = unpacker.unpack()
    if type_id != _STORE_BATCH_TYPE_ID or type(correlation_id) is not int:
        raise _Invalid
    if unpacker.read_array_header() != 1:
        raise _Invalid  # a field this build does not know: refused (module docstring)
    count = unpacker.read_array_header()
    if not 0 < count <= STORE_BATCH_STORES_MAX:
        raise _Invalid
    decode_store = _DECODERS[_STORE_TYPE_ID]
    view = memoryview(body)
    stores: list[Store] = []
    start = unpacker.tell()
    for _ in range(count):
        fields = unpacker.unpack()
        end = unpacker.tell()
        if type(fields) is not tuple or len(fields) > _STORE_FIELDS_COUNT:
            raise _Invalid
        store = decode_store(fields)
        object.__setattr__(store, "wire_fields", view[start:end])
        stores.append(store)
        start = end
    if start != len(body):
        raise _Invalid  # trailing bytes
    return correlation_id, StoreBatch(stores=tuple(stores))
_UINT_BYTES = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
"""msgpack's uint8/16/32/64 markers and how many bytes follow them."""


def _fields_offset(body: bytes) -> int | None:
    """Where the field array starts in a decoded frame body shaped as ``encode_parts`` makes
    it (fixarray of 3, fixint type, unsigned correlation id); None for any other shape (legal,
    but then the fields are not cut out)."""
    if len(body) < 3 or body[0] != 0x93 or body[1] >= 0x80:
        return None
    marker = body[2]
    if marker < 0x80:
        return 3
    size = _UINT_BYTES.get(marker)
    return None if size is None else 3 + size
