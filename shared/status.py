"""The one ``Status`` enum, shared by the node-to-node wire, the cores and the HTTP API.

Names follow LogDevice's ``errors.inc`` where LogDevice has one. Numbers are permanent:
a retired status keeps its number forever. ``LogError`` is the single exception type and is
raised only at API edges; cores return a ``Status`` instead.
"""

from __future__ import annotations

from enum import IntEnum


class Status(IntEnum):
    OK = 0
    NOTFOUND = 1
    TIMEDOUT = 2
    NOSEQUENCER = 3
    PREEMPTED = 4
    SEQNOBUFS = 5
    TOOBIG = 6
    AGAIN = 7
    STALE = 8
    UPTODATE = 9
    BADMSG = 10
    SHUTDOWN = 11
    NOTREADY = 12
    OVERLOADED = 13
    NOSPC = 14
    DISABLED = 15
    CHECKSUM_MISMATCH = 16
    INVALID_PARAM = 17
    INTERNAL = 18
    CONNFAILED = 19
    NOTINCONFIG = 20
    PROTONOSUPPORT = 21
    EXISTS = 22
    DATALOSS = 23
    PEER_CLOSED = 24
    UNAUTHENTICATED = 25
    ACCESS = 26
    RATE_LIMITED = 27

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]

    @property
    def retryable(self) -> bool:
        return self in RETRYABLE


_DESCRIPTIONS: dict[Status, str] = {
    Status.OK: "success",
    Status.NOTFOUND: "no such log, record or route",
    Status.TIMEDOUT: "timed out; the outcome is unknown",
    Status.NOSEQUENCER: "no sequencer is available for the log",
    Status.PREEMPTED: "the epoch was sealed by a newer sequencer",
    Status.SEQNOBUFS: "the log's sliding window is full; nothing was written",
    Status.TOOBIG: "payload, batch or frame over the configured maximum",
    Status.AGAIN: "a concurrent change won; try again",
    Status.STALE: "the value is not newer than the stored one",
    Status.UPTODATE: "nothing to change",
    Status.BADMSG: "the message or request is malformed",
    Status.SHUTDOWN: "the node is shutting down",
    Status.NOTREADY: "the node is not ready to serve yet",
    Status.OVERLOADED: "the node is overloaded; nothing was written",
    Status.NOSPC: "out of disk space",
    Status.DISABLED: "the node does not accept writes",
    Status.CHECKSUM_MISMATCH: "a payload checksum did not match",
    Status.INVALID_PARAM: "a parameter is out of range or of the wrong type",
    Status.INTERNAL: "an internal error; the outcome is unknown",
    Status.CONNFAILED: "could not connect to the peer",
    Status.NOTINCONFIG: "the node is not in the cluster configuration",
    Status.PROTONOSUPPORT: "the peer speaks an incompatible protocol or cluster config",
    Status.EXISTS: "the object already exists",
    Status.DATALOSS: "records that may have been acknowledged cannot be found",
    Status.PEER_CLOSED: "the connection closed after the request was sent; outcome unknown",
    Status.UNAUTHENTICATED: "missing, malformed, expired or revoked credentials; nothing "
                            "was done",
    Status.ACCESS: "the principal lacks the permission for this operation on this log; "
                   "nothing was done",
    Status.RATE_LIMITED: "the principal's append rate, bytes/s or connection quota is used "
                         "up; nothing was written",
}

RETRYABLE: frozenset[Status] = frozenset(
    {
        Status.TIMEDOUT,
        Status.NOSEQUENCER,
        Status.PREEMPTED,
        Status.SEQNOBUFS,
        Status.AGAIN,
        Status.SHUTDOWN,
        Status.NOTREADY,
        Status.OVERLOADED,
        Status.NOSPC,
        Status.CONNFAILED,
        Status.PEER_CLOSED,
        Status.RATE_LIMITED,
    }
)

assert set(_DESCRIPTIONS) == set(Status)


class LogError(Exception):
    """An operation failed with ``status``; raised only at API edges (client, HTTP, CLI)."""

    def __init__(self, status: Status, message: str = "") -> None:
        super().__init__(f"{status.name}: {message or status.description}")
        self.status = status
        self.message = message or status.description
