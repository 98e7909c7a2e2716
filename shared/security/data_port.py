"""Client authentication and permissions on the data port (the binary client protocol,
docs/PROTOCOL.md): the token comes in the client's HELLO, is verified once per connection
(and again only after a reload of the credentials), and every request is checked against the
principal's grants before any handler sees it. A refused request is answered with its own
reply type carrying ``ACCESS`` or ``RATE_LIMITED`` and nothing is done; a HELLO without
valid credentials is answered ``UNAUTHENTICATED`` and the connection closed."""

from __future__ import annotations

import math

from shared.security.auth import Authenticator, Denied, Identity
from shared.security.permissions import Action
from shared.status import Status
from shared.types import Epoch, Lsn, log_id_valid
from shared.wire.append import Append, Appended
from shared.wire.codec import Message
from shared.wire.read import GetLogState, LogState, Read, ReadReply
from shared.wire.trim import FindTime, FoundTime


def refusal(message: Message, denied: Denied) -> Message | None:
    """The reply to a client request refused with ``denied`` (None: a one-way message)."""
    status, text = denied.status, denied.message
    if type(message) is Append:
        assert isinstance(message, Append)
        return Appended(status=status, log_id=message.log_id, first_lsn=Lsn(0),
                        last_lsn=Lsn(0), timestamp_ms=0, sequencer_node=None, message=text,
                        retry_after_ms=math.ceil(denied.retry_after_s * 1000))
    if type(message) is Read:
        assert isinstance(message, Read)
        return ReadReply(status=status, log_id=message.log_id, release_lsn=Lsn(0),
                         records=(), next_lsn=message.from_lsn)
    if type(message) is GetLogState:
        assert isinstance(message, GetLogState)
        return LogState(status=status, log_id=message.log_id, release_lsn=Lsn(0),
                        sealed_epoch=Epoch(0), last_lsn=Lsn(0))
    if type(message) is FindTime:
        assert isinstance(message, FindTime)
        return FoundTime(status=status, log_id=message.log_id, lsn=Lsn(0))
    return None


PERMITTED_CACHED_MAX = 1024
_ACTIONS: dict[type, Action] = {Append: Action.APPEND, Read: Action.READ,
                                GetLogState: Action.READ, FindTime: Action.READ}


class ClientGuard:
    """The credentials of one client connection."""

    __slots__ = ("_auth", "_clock", "_permitted", "identity", "token")

    def __init__(self, auth: Authenticator, identity: Identity, token: str) -> None:
        self._auth = auth
        self._clock = auth.clock
        self.identity = identity
        self.token = token
        self._permitted: set[tuple[type, int]] = set()
        """(message type, log id) pairs ``identity`` was allowed: checked once per
        connection."""

    @staticmethod
    def hello(auth: Authenticator, token: str) -> ClientGuard | Denied:
        """Authenticate a client's HELLO and count its connection under its principal."""
        found = auth.authenticate(token or None)
        if isinstance(found, Denied):
            return found
        denied = auth.connection_opened(found)
        if denied is not None:
            return denied
        return ClientGuard(auth, found, token)

    def closed(self) -> None:
        self._auth.connection_closed(self.identity)

    def check(self, message: Message) -> Denied | None:
        """None if the principal may send ``message`` now (an append is then charged to its
        quota), else why not. Per request on the data port: the usual case (same identity,
        an (action, log) already allowed, no quota) is a few comparisons and one set lookup."""
        auth = self._auth
        identity = self.identity
        if identity.generation != auth.generation or identity.expires_s <= self._clock():
            current = auth.authenticate(self.token)
            if isinstance(current, Denied):
                return current
            self.identity = identity = current
            self._permitted = set()
        # Keyed by the message's type, not its Action: an Enum's hash is Python code.
        kind = type(message)
        key = (kind, message.log_id)  # type: ignore[union-attr]
        if key not in self._permitted:
            denied = self._first_check(key, message)
            if denied is not None:
                return denied
        if kind is not Append or not identity.metered:
            return None
        assert isinstance(message, Append)
        return auth.admit_append(identity, message.records or len(message.payloads),
                                 sum(len(p) for p in message.payloads))

    def _first_check(self, key: tuple[type, int], message: Message) -> Denied | None:
        """The permission check of a (message type, log) this connection has not used yet."""
        kind, log_id = key
        action = _ACTIONS.get(kind)
        if action is None:
            return Denied(Status.ACCESS, f"clients may not send {type(message).__name__}")
        if not log_id_valid(log_id):
            # Nothing to grant on: the handler refuses the request (INVALID_PARAM).
            return None
        denied = self._auth.permit(self.identity, action, log_id)
        if denied is None and len(self._permitted) < PERMITTED_CACHED_MAX:
            self._permitted.add(key)
        return denied
