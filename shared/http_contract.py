"""The HTTP contract (API.md) shared by the server edge and the ``seqlog`` client: header
names, media types, the one table that maps every ``Status`` to an HTTP status code, and which
statuses mean "nothing was written", "outcome unknown" and "try another node".

API.md fixes the codes of the statuses a caller is told about. The rest are chosen here, once:

- ``PREEMPTED``, ``AGAIN``, ``CONNFAILED``, ``DISABLED``, ``NOTINCONFIG`` and
  ``PROTONOSUPPORT`` are 503: this node cannot serve the request now and, like every 503 in
  API.md, nothing was written. A role that cannot promise "nothing was written" after one of
  these must report ``TIMEDOUT`` instead.
- ``STALE``, ``UPTODATE`` and ``EXISTS`` are 409: the request conflicts with stored state.
- ``PEER_CLOSED`` (a node-to-node request was sent, then its connection dropped) is 504, like
  ``TIMEDOUT``: the outcome is unknown.
- ``UNAUTHENTICATED`` is 401 (with ``WWW-Authenticate: Bearer``), ``ACCESS`` 403 and
  ``RATE_LIMITED`` 429 (docs/SECURITY.md): the request was refused before anything was done.
- ``CHECKSUM_MISMATCH`` and ``DATALOSS`` are 500: something the cluster stored is damaged,
  which the caller cannot fix by retrying and must treat like a bug (outcome unknown).

Every 429 and 503 answer carries ``Retry-After`` (``ApiConfig.retry_after_s``).
"""

from __future__ import annotations

from typing import Literal

from shared.status import Status

SEQUENCER_HEADER = "X-Seqlog-Sequencer"
"""Answer header: the node that sequenced (or sequences) the log."""
NO_FORWARD_HEADER = "X-Seqlog-No-Forward"
"""Request header (or ``no_forward`` query): redirect instead of forwarding the append."""
NO_FORWARD_QUERY = "no_forward"
RETRY_AFTER_HEADER = "Retry-After"
AUTHORIZATION_HEADER = "Authorization"
"""Request header: ``Bearer <token>`` (docs/SECURITY.md)."""
WWW_AUTHENTICATE_HEADER = "WWW-Authenticate"
BEARER_PREFIX = "Bearer "
TOKEN_ENV = "SEQLOG_TOKEN"
"""The environment variable the ``seqlog`` client and CLI take a bearer token from."""

MediaType = Literal["application/json", "application/msgpack"]
JSON: MediaType = "application/json"
MSGPACK: MediaType = "application/msgpack"
MEDIA_TYPE_ALIASES: dict[str, MediaType] = {
    "application/json": JSON,
    "application/msgpack": MSGPACK,
    "application/x-msgpack": MSGPACK,
    "application/vnd.msgpack": MSGPACK,
}
"""Content-Type / Accept values the server understands, by the media type they mean."""

NOTHING_WRITTEN: frozenset[Status] = frozenset(
    {Status.SEQNOBUFS, Status.NOSEQUENCER, Status.NOTREADY, Status.SHUTDOWN, Status.OVERLOADED,
     Status.RATE_LIMITED})
"""Append answers after which nothing was written: retrying cannot duplicate a record (and
clients retry them). ``UNAUTHENTICATED`` and ``ACCESS`` write nothing too but are final:
retrying with the same credentials cannot help."""
OUTCOME_UNKNOWN: frozenset[Status] = frozenset({Status.TIMEDOUT, Status.PEER_CLOSED})
"""Append answers after which the records may or may not have been written."""
TRY_ELSEWHERE: frozenset[Status] = frozenset({Status.NOTREADY, Status.SHUTDOWN})
"""Answers that say this node cannot serve now; another node may."""

HTTP_STATUS: dict[Status, int] = {
    Status.OK: 200,
    Status.NOTFOUND: 404,
    Status.TIMEDOUT: 504,
    Status.NOSEQUENCER: 503,
    Status.PREEMPTED: 503,
    Status.SEQNOBUFS: 429,
    Status.TOOBIG: 413,
    Status.AGAIN: 503,
    Status.STALE: 409,
    Status.UPTODATE: 409,
    Status.BADMSG: 400,
    Status.SHUTDOWN: 503,
    Status.NOTREADY: 503,
    Status.OVERLOADED: 503,
    Status.NOSPC: 503,
    Status.DISABLED: 503,
    Status.CHECKSUM_MISMATCH: 500,
    Status.INVALID_PARAM: 400,
    Status.INTERNAL: 500,
    Status.CONNFAILED: 503,
    Status.PEER_CLOSED: 504,
    Status.NOTINCONFIG: 503,
    Status.PROTONOSUPPORT: 503,
    Status.EXISTS: 409,
    Status.DATALOSS: 500,
    Status.UNAUTHENTICATED: 401,
    Status.ACCESS: 403,
    Status.RATE_LIMITED: 429,
}

RETRY_AFTER_HTTP_CODES: frozenset[int] = frozenset({429, 503})
"""HTTP codes whose answers tell the caller when to come back."""

assert set(HTTP_STATUS) == set(Status), "every Status needs an HTTP code"


def http_code(status: Status) -> int:
    """The HTTP status code of an answer carrying ``status``."""
    return HTTP_STATUS[status]


def wants_retry_after(status: Status) -> bool:
    return HTTP_STATUS[status] in RETRY_AFTER_HTTP_CODES
