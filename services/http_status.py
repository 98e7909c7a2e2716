"""The one table that maps every ``Status`` to an HTTP status code, for the HTTP API edge.

API.md fixes the codes of the statuses a caller is told about. The rest are chosen here, once:

- ``PREEMPTED``, ``AGAIN``, ``CONNFAILED``, ``DISABLED``, ``NOTINCONFIG`` and
  ``PROTONOSUPPORT`` are 503: this node cannot serve the request now and, like every 503 in
  API.md, nothing was written. A role that cannot promise "nothing was written" after one of
  these must report ``TIMEDOUT`` instead.
- ``STALE``, ``UPTODATE`` and ``EXISTS`` are 409: the request conflicts with stored state.
- ``PEER_CLOSED`` (a node-to-node request was sent, then its connection dropped) is 504, like
  ``TIMEDOUT``: the outcome is unknown.
- ``CHECKSUM_MISMATCH`` and ``DATALOSS`` are 500: something the cluster stored is damaged,
  which the caller cannot fix by retrying and must treat like a bug (outcome unknown).

Every 429 and 503 answer carries ``Retry-After`` (``ApiConfig.retry_after_s``).
"""

from __future__ import annotations

from shared.status import Status

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
}

RETRY_AFTER_HTTP_CODES: frozenset[int] = frozenset({429, 503})
"""HTTP codes whose answers tell the caller when to come back."""

assert set(HTTP_STATUS) == set(Status), "every Status needs an HTTP code"


def http_code(status: Status) -> int:
    """The HTTP status code of an answer carrying ``status``."""
    return HTTP_STATUS[status]


def wants_retry_after(status: Status) -> bool:
    return HTTP_STATUS[status] in RETRY_AFTER_HTTP_CODES
