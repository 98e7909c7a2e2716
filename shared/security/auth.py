"""The node's credentials state: signing keys, principals with their grants and quotas, and
revoked token ids, read from ``AuthConfig.key_file`` and ``permissions_file`` and re-read
when they change (polled every ``reload_interval_ms``, and on SIGHUP) without a restart.

``Authenticator.authenticate`` turns a bearer token into an ``Identity`` once: identities are
cached by token, and the cache is dropped on every reload, so a revoked token (or a changed
grant) takes effect at the next reload and verifying a signature is paid once per token per
reload, not per request. A connection that keeps its ``Identity`` re-authenticates when
``generation`` moved. A file that does not parse is refused with a logged reason and the node
keeps its previous state.

The permissions file (JSON)::

    {"principals": {"alice": {"grants": ["append:1-100", "read:1-100"],
                              "append_records_per_s": 1000, "append_bytes_per_s": 1000000,
                              "connections_max": 50, "disabled": false}},
     "revoked_tokens": ["3f2a9c0d11e2b4a7"]}

A request is allowed when every source that speaks allows it: the token's scope (if the
token has one) and the principal's grants in the file (if the principal is listed). A
principal not in the file is limited to its token's scope; an unscoped token of an unlisted
principal may do nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiofiles

from shared.config import AuthConfig
from shared.security.permissions import Action, GrantError, Grants
from shared.security.quotas import AppendQuota
from shared.security.tokens import TokenError, parse_key_file, verify
from shared.status import Status

log = logging.getLogger(__name__)

IDENTITIES_CACHED_MAX = 100_000
"""Verified tokens remembered between reloads; past it the cache starts over."""
PRINCIPALS_MAX = 100_000
REVOKED_MAX = 1_000_000
PERMISSIONS_FILE_BYTES_MAX = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PrincipalEntry:
    grants: Grants
    disabled: bool = False
    append_records_per_s: int | None = None
    append_bytes_per_s: int | None = None
    connections_max: int | None = None


@dataclass(frozen=True, slots=True)
class AuthState:
    keys: tuple[bytes, ...] = ()
    principals: dict[str, PrincipalEntry] = field(default_factory=dict)
    revoked: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated principal, as of reload ``generation``."""

    principal: str
    token_id: str
    expires_s: float
    scope: Grants | None
    entry: PrincipalEntry | None
    generation: int
    metered: bool = False
    """Whether an append rate applies to the principal (else appends skip the quota)."""

    def allows(self, action: Action, log_id: int) -> bool:
        if self.scope is None and self.entry is None:
            return False
        return ((self.scope is None or self.scope.allows(action, log_id))
                and (self.entry is None or self.entry.grants.allows(action, log_id)))

    def allows_cluster(self) -> bool:
        if self.scope is None and self.entry is None:
            return False
        return ((self.scope is None or self.scope.allows_cluster())
                and (self.entry is None or self.entry.grants.allows_cluster()))


@dataclass(frozen=True, slots=True)
class Denied:
    """Why a request is refused: ``UNAUTHENTICATED``, ``ACCESS`` or ``RATE_LIMITED``."""

    status: Status
    message: str
    retry_after_s: float = 0.0


class PermissionsError(ValueError):
    """A permissions file that does not parse."""


def _opt_int(name: str, principal: str, value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= 10**15:
        raise PermissionsError(f"principal {principal!r}: {name} must be an integer >= 0")
    return value


def parse_permissions(text: str) -> tuple[dict[str, PrincipalEntry], frozenset[str]]:
    """The principals and revoked token ids of a permissions file; PermissionsError if bad."""
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise PermissionsError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise PermissionsError("the permissions file must hold a JSON object")
    unknown = set(doc) - {"principals", "revoked_tokens"}
    if unknown:
        raise PermissionsError(f"unknown keys {sorted(unknown)}")
    principals_doc = doc.get("principals", {})
    revoked_doc = doc.get("revoked_tokens", [])
    if not isinstance(principals_doc, dict) or len(principals_doc) > PRINCIPALS_MAX:
        raise PermissionsError(f"principals must be an object of at most {PRINCIPALS_MAX}")
    if (not isinstance(revoked_doc, list) or len(revoked_doc) > REVOKED_MAX
            or not all(isinstance(t, str) for t in revoked_doc)):
        raise PermissionsError("revoked_tokens must be a list of token ids (strings)")
    principals: dict[str, PrincipalEntry] = {}
    for name, entry in principals_doc.items():
        if not isinstance(entry, dict):
            raise PermissionsError(f"principal {name!r} must be an object")
        unknown = set(entry) - {"grants", "disabled", "append_records_per_s",
                                "append_bytes_per_s", "connections_max"}
        if unknown:
            raise PermissionsError(f"principal {name!r}: unknown keys {sorted(unknown)}")
        grants = entry.get("grants", [])
        if not isinstance(grants, list):
            raise PermissionsError(f"principal {name!r}: grants must be a list")
        try:
            parsed = Grants.parse(grants)
        except GrantError as exc:
            raise PermissionsError(f"principal {name!r}: {exc}") from None
        disabled = entry.get("disabled", False)
        if not isinstance(disabled, bool):
            raise PermissionsError(f"principal {name!r}: disabled must be true or false")
        principals[name] = PrincipalEntry(
            grants=parsed, disabled=disabled,
            append_records_per_s=_opt_int("append_records_per_s", name,
                                          entry.get("append_records_per_s")),
            append_bytes_per_s=_opt_int("append_bytes_per_s", name,
                                        entry.get("append_bytes_per_s")),
            connections_max=_opt_int("connections_max", name, entry.get("connections_max")))
    return principals, frozenset(revoked_doc)


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class Authenticator:
    """Verifies tokens, answers permission checks, meters appends and counts connections per
    principal. One per node, shared by the HTTP edge and the data port."""

    def __init__(self, config: AuthConfig, *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.enabled = config.enabled
        self._clock = clock
        self._monotonic = monotonic
        self.state = AuthState()
        self.generation = 0
        self._identities: dict[str, Identity] = {}
        self._quotas: dict[str, AppendQuota] = {}
        self._connections: dict[str, int] = {}
        self._stamps: tuple[object, object] = (None, None)
        self._reload_task: asyncio.Task[None] | None = None
        self._reload_again = False
        # Counters for /metrics.
        self.unauthenticated_count = 0
        self.denied_count = 0
        self.rate_limited_count = 0
        self.reloads_count = 0
        self.reload_failures_count = 0

    # ---- loading -------------------------------------------------------------------------

    def _stat(self) -> tuple[object, object]:
        def one(path: str) -> object:
            if not path:
                return None
            try:
                st = os.stat(path)
            except OSError:
                return "missing"
            return (st.st_mtime_ns, st.st_size, st.st_ino)

        return one(self.config.key_file), one(self.config.permissions_file)

    def _apply(self, key_text: str, permissions_text: str) -> None:
        keys = parse_key_file(key_text)
        principals, revoked = parse_permissions(permissions_text)
        self.state = AuthState(keys=keys, principals=principals, revoked=revoked)
        self.generation += 1
        self._identities = {}
        self.reloads_count += 1

    def load(self) -> None:
        """Read the files now (start-up); raises on a bad file when auth is on."""
        if not self.enabled:
            return
        self._stamps = self._stat()
        with open(self.config.key_file, encoding="utf-8") as f:
            key_text = f.read()
        permissions_text = ""
        if self.config.permissions_file:
            with open(self.config.permissions_file, encoding="utf-8") as f:
                permissions_text = f.read()
        self._apply(key_text, permissions_text)

    async def reload(self) -> bool:
        """Re-read the files (off the loop); False and the old state kept if one is bad."""
        if not self.enabled:
            return False
        stamps = self._stat()
        try:
            async with aiofiles.open(self.config.key_file, encoding="utf-8") as f:
                key_text = await f.read()
            permissions_text = ""
            if self.config.permissions_file:
                async with aiofiles.open(self.config.permissions_file, encoding="utf-8") as f:
                    permissions_text = await f.read(PERMISSIONS_FILE_BYTES_MAX)
            self._apply(key_text, permissions_text)
        except (OSError, ValueError) as exc:
            self.reload_failures_count += 1
            self._stamps = stamps
            log.error("auth files not reloaded (keeping the previous ones): %s", exc)
            return False
        self._stamps = stamps
        log.info("auth files reloaded: %d keys, %d principals, %d revoked tokens",
                 len(self.state.keys), len(self.state.principals), len(self.state.revoked))
        return True

    def request_reload(self) -> None:
        """SIGHUP: reload now (one at a time; one more if asked during a reload)."""
        if not self.enabled:
            return
        if self._reload_task is not None and not self._reload_task.done():
            self._reload_again = True
            return
        self._reload_task = asyncio.get_running_loop().create_task(self._reloads())

    async def _reloads(self) -> None:
        while True:
            self._reload_again = False
            await self.reload()
            if not self._reload_again:
                return

    async def watch(self) -> None:
        """Poll the files every ``reload_interval_ms``; reload the ones that changed."""
        interval_s = self.config.reload_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            if self._stat() != self._stamps:
                await self.reload()

    # ---- checks --------------------------------------------------------------------------

    def now_s(self) -> float:
        return self._clock()

    @property
    def clock(self) -> Callable[[], float]:
        """The wall clock token expiry is judged by (``time.time``; tests inject theirs)."""
        return self._clock

    def authenticate(self, token: str | None) -> Identity | Denied:
        """The identity of a bearer token, or ``UNAUTHENTICATED``."""
        if token is None:
            self.unauthenticated_count += 1
            return Denied(Status.UNAUTHENTICATED,
                          "credentials required: send 'Authorization: Bearer <token>'")
        identity = self._identities.get(token)
        now_s = self._clock()
        if identity is None:
            found = self._verify(token, now_s)
            if isinstance(found, Denied):
                self.unauthenticated_count += 1
                return found
            identity = found
            if len(self._identities) >= IDENTITIES_CACHED_MAX:
                self._identities = {}
            self._identities[token] = identity
        if identity.expires_s <= now_s:
            self.unauthenticated_count += 1
            return Denied(Status.UNAUTHENTICATED, "the token has expired")
        return identity

    def _verify(self, token: str, now_s: float) -> Identity | Denied:
        state = self.state
        try:
            claims = verify(token, state.keys, now_s=now_s)
        except TokenError as exc:
            return Denied(Status.UNAUTHENTICATED, str(exc))
        if claims.token_id in state.revoked:
            return Denied(Status.UNAUTHENTICATED, "the token has been revoked")
        entry = state.principals.get(claims.principal)
        if entry is not None and entry.disabled:
            return Denied(Status.UNAUTHENTICATED,
                          f"principal {claims.principal!r} is disabled")
        records, size = self._rates(entry)
        return Identity(principal=claims.principal, token_id=claims.token_id,
                        expires_s=claims.expires_s, scope=claims.scope, entry=entry,
                        generation=self.generation, metered=bool(records or size))

    def _rates(self, entry: PrincipalEntry | None) -> tuple[int, int]:
        """The principal's append records/s and bytes/s (0: unlimited)."""
        records = (entry.append_records_per_s if entry is not None
                   and entry.append_records_per_s is not None
                   else self.config.append_records_per_s)
        size = (entry.append_bytes_per_s if entry is not None
                and entry.append_bytes_per_s is not None else self.config.append_bytes_per_s)
        return records, size

    def current(self, identity: Identity, token: str) -> Identity | Denied:
        """``identity`` if still valid under the current files, else re-authenticated."""
        if identity.generation == self.generation and identity.expires_s > self._clock():
            return identity
        return self.authenticate(token)

    def permit(self, identity: Identity, action: Action, log_id: int) -> Denied | None:
        if identity.allows(action, log_id):
            return None
        self.denied_count += 1
        return Denied(Status.ACCESS, f"principal {identity.principal!r} may not "
                                     f"{action.value} log {log_id}; nothing was done")

    def permit_cluster(self, identity: Identity) -> Denied | None:
        if identity.allows_cluster():
            return None
        self.denied_count += 1
        return Denied(Status.ACCESS, f"principal {identity.principal!r} may not run cluster "
                                     "operations (needs admin on every log); nothing was done")

    def _quota(self, identity: Identity) -> AppendQuota | None:
        if not identity.metered:
            return None
        records, size = self._rates(identity.entry)
        if not records and not size:
            return None
        quota = self._quotas.get(identity.principal)
        if quota is None or quota.rates() != (float(records), float(size)):
            if len(self._quotas) >= PRINCIPALS_MAX:
                self._quotas.clear()
            quota = self._quotas[identity.principal] = AppendQuota(
                records, size, self._monotonic())
        return quota

    def admit_append(self, identity: Identity, records: int, size_bytes: int) -> Denied | None:
        """Charge an append to its principal's quota, or ``RATE_LIMITED`` and no charge."""
        quota = self._quota(identity)
        if quota is None:
            return None
        wait_s = quota.admit(records, size_bytes, self._monotonic())
        if wait_s <= 0:
            return None
        self.rate_limited_count += 1
        return Denied(Status.RATE_LIMITED,
                      f"principal {identity.principal!r} is over its append quota; "
                      "nothing written", retry_after_s=wait_s)

    def connection_opened(self, identity: Identity) -> Denied | None:
        """Count one more connection of the principal, or refuse it past its bound."""
        entry = identity.entry
        bound = (entry.connections_max if entry is not None and entry.connections_max
                 is not None else self.config.connections_per_principal_max)
        count = self._connections.get(identity.principal, 0)
        if count >= bound:
            self.rate_limited_count += 1
            return Denied(Status.RATE_LIMITED,
                          f"principal {identity.principal!r} holds {count} connections to "
                          f"this node (at most {bound})", retry_after_s=1.0)
        self._connections[identity.principal] = count + 1
        return None

    def connection_closed(self, identity: Identity) -> None:
        count = self._connections.get(identity.principal, 0) - 1
        if count <= 0:
            self._connections.pop(identity.principal, None)
        else:
            self._connections[identity.principal] = count

    def stats(self) -> dict[str, Any]:
        return {"auth_unauthenticated": self.unauthenticated_count,
                "auth_denied": self.denied_count,
                "auth_rate_limited": self.rate_limited_count,
                "auth_reloads": self.reloads_count,
                "auth_reload_failures": self.reload_failures_count}
