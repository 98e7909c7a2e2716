"""Tokens, grants, the permissions file and quotas (shared.security), with fuzzing of every
parser a client's bytes reach: grants, the permissions file and the token verifier."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import AuthConfig
from shared.security.auth import (
    Authenticator,
    Denied,
    Identity,
    PermissionsError,
    bearer_token,
    parse_permissions,
)
from shared.security.permissions import Action, GrantError, Grants, parse_grant
from shared.security.quotas import AppendQuota, retry_after_header_s
from shared.security.tokens import TokenError, mint, new_key, parse_key_file, verify
from shared.status import Status
from shared.types import LOG_ID_MAX
from tests.unit.net.transport_helpers import wait_until

KEY = new_key().encode()
OTHER_KEY = new_key().encode()


def test_grants_parse_and_check_ranges() -> None:
    grants = Grants.parse(["append:1-100", "read:7", "trim:*"])
    assert grants.allows(Action.APPEND, 1) and grants.allows(Action.APPEND, 100)
    assert not grants.allows(Action.APPEND, 101)
    assert grants.allows(Action.READ, 7) and not grants.allows(Action.READ, 8)
    assert grants.allows(Action.TRIM, LOG_ID_MAX)
    assert not grants.allows_cluster()
    admin = Grants.parse(["admin"])
    assert admin.allows(Action.APPEND, 5) and admin.allows_cluster()
    assert not Grants.parse(["admin:1-10"]).allows_cluster()
    assert str(parse_grant("append:1-100")) == "append:1-100"
    for bad in ("write:1", "append:0", "append:5-4", "append:x", "append:1-", "", "read:\u00b3",
                "read:1-\u0663"):
        with pytest.raises(GrantError):
            parse_grant(bad)


@given(st.text(max_size=80))
@settings(max_examples=300, deadline=None)
def test_parse_grant_fuzz(text: str) -> None:
    try:
        grant = parse_grant(text)
    except GrantError:
        return
    assert 1 <= grant.first_log_id <= grant.last_log_id <= LOG_ID_MAX
    assert parse_grant(str(grant)) == grant


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda children: st.lists(children, max_size=4)
                    | st.dictionaries(st.sampled_from(
                        ["principals", "revoked_tokens", "grants", "alice", "disabled",
                         "append_records_per_s", "connections_max", "x"]), children,
                        max_size=4), max_leaves=20))
@settings(max_examples=300, deadline=None)
def test_parse_permissions_fuzz(doc: object) -> None:
    try:
        principals, revoked = parse_permissions(json.dumps(doc))
    except PermissionsError:
        return
    assert all(isinstance(t, str) for t in revoked)
    assert all(isinstance(name, str) for name in principals)


def test_tokens_verify_sign_expiry_and_scope() -> None:
    token = mint(KEY, "alice", ttl_s=60, scope=["append:1-100"], token_id="t1")
    claims = verify(token, [OTHER_KEY, KEY])
    assert (claims.principal, claims.token_id) == ("alice", "t1")
    assert claims.scope is not None and claims.scope.allows(Action.APPEND, 100)
    with pytest.raises(TokenError, match="unknown key"):
        verify(token, [OTHER_KEY])
    with pytest.raises(TokenError, match="expired"):
        verify(token, [KEY], now_s=claims.expires_s + 1)
    forged = mint(OTHER_KEY, "alice", ttl_s=60)
    # Same kid as KEY's, other signature: refused.
    head, payload, _ = forged.split(".")
    real_head = token.split(".")[0]
    with pytest.raises(TokenError):
        verify(f"{real_head}.{payload}.{forged.split('.')[2]}", [KEY])
    assert head != real_head


@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
@settings(max_examples=300, deadline=None)
def test_verify_fuzz(text: str) -> None:
    with contextlib.suppress(TokenError):
        verify(text, [KEY])


def test_key_file_rules() -> None:
    assert parse_key_file(f"# comment\n{KEY.decode()}\n\n{OTHER_KEY.decode()}\n") == (
        KEY, OTHER_KEY)
    with pytest.raises(TokenError):
        parse_key_file("short\n")
    with pytest.raises(TokenError):
        parse_key_file("\n# none\n")


def test_bearer_header() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token(None) is None
    assert bearer_token("Bearer") is None


def test_quota_refuses_without_charging_and_says_when() -> None:
    quota = AppendQuota(records_per_s=10, bytes_per_s=1000, now_s=0.0)
    assert quota.admit(10, 100, 0.0) == 0.0
    wait_s = quota.admit(1, 1, 0.0)
    assert wait_s == pytest.approx(0.1)
    assert retry_after_header_s(wait_s) == 1
    assert quota.admit(1, 1, 0.1) == 0.0
    # Bytes bound alone.
    assert quota.admit(1, 1000, 5.0) == 0.0
    assert quota.admit(1, 500, 5.0) == pytest.approx(0.5)


def _auth(tmp_path: Path, permissions: dict[str, object], **config: object) -> Authenticator:
    (tmp_path / "keys").write_text(KEY.decode() + "\n")
    (tmp_path / "perms.json").write_text(json.dumps(permissions))
    auth = Authenticator(AuthConfig(enabled=True, key_file=str(tmp_path / "keys"),
                                    permissions_file=str(tmp_path / "perms.json"),
                                    **config))  # type: ignore[arg-type]
    auth.load()
    return auth


def test_authenticator_intersects_token_scope_and_file_grants(tmp_path: Path) -> None:
    auth = _auth(tmp_path, {"principals": {"alice": {"grants": ["read:1-100"]}}})
    unscoped = auth.authenticate(mint(KEY, "alice", ttl_s=60))
    assert isinstance(unscoped, Identity)
    assert auth.permit(unscoped, Action.READ, 100) is None
    denied = auth.permit(unscoped, Action.READ, 101)
    assert isinstance(denied, Denied) and denied.status is Status.ACCESS
    scoped = auth.authenticate(mint(KEY, "alice", ttl_s=60, scope=["read:1-10"]))
    assert isinstance(scoped, Identity) and auth.permit(scoped, Action.READ, 11) is not None
    # Unlisted principal: its token's scope only; unscoped: nothing.
    bob = auth.authenticate(mint(KEY, "bob", ttl_s=60, scope=["append:5"]))
    assert isinstance(bob, Identity) and auth.permit(bob, Action.APPEND, 5) is None
    nobody = auth.authenticate(mint(KEY, "carol", ttl_s=60))
    assert isinstance(nobody, Identity) and auth.permit(nobody, Action.READ, 1) is not None
    missing = auth.authenticate(None)
    assert isinstance(missing, Denied) and missing.status is Status.UNAUTHENTICATED


def test_revocation_takes_effect_at_the_next_reload(tmp_path: Path) -> None:
    auth = _auth(tmp_path, {"principals": {"alice": {"grants": ["admin"]}}})
    token = mint(KEY, "alice", ttl_s=60, token_id="doomed")
    assert isinstance(auth.authenticate(token), Identity)
    (tmp_path / "perms.json").write_text(json.dumps(
        {"principals": {"alice": {"grants": ["admin"]}}, "revoked_tokens": ["doomed"]}))
    assert isinstance(auth.authenticate(token), Identity)  # cached until the reload
    assert asyncio.run(auth.reload())
    refused = auth.authenticate(token)
    assert isinstance(refused, Denied) and "revoked" in refused.message
    # A broken file keeps the previous state.
    (tmp_path / "perms.json").write_text("{not json")
    assert not asyncio.run(auth.reload())
    assert isinstance(auth.authenticate(token), Denied)
    assert auth.reload_failures_count == 1


def test_quota_and_connection_bounds_per_principal(tmp_path: Path) -> None:
    auth = _auth(tmp_path, {"principals": {"alice": {"grants": ["admin"],
                                                     "append_records_per_s": 5,
                                                     "connections_max": 2}}})
    alice = auth.authenticate(mint(KEY, "alice", ttl_s=60))
    assert isinstance(alice, Identity)
    assert auth.admit_append(alice, 5, 10) is None
    limited = auth.admit_append(alice, 1, 1)
    assert isinstance(limited, Denied) and limited.status is Status.RATE_LIMITED
    assert limited.retry_after_s > 0
    assert auth.connection_opened(alice) is None and auth.connection_opened(alice) is None
    assert auth.connection_opened(alice) is not None
    auth.connection_closed(alice)
    assert auth.connection_opened(alice) is None


def test_sighup_reload_and_the_mtime_watch_pick_up_changes(tmp_path: Path) -> None:
    auth = _auth(tmp_path, {"principals": {"alice": {"grants": ["admin"]}}},
                 reload_interval_ms=10)
    token = mint(KEY, "alice", ttl_s=60, token_id="t")

    async def run() -> None:
        assert isinstance(auth.authenticate(token), Identity)
        (tmp_path / "perms.json").write_text(json.dumps({"revoked_tokens": ["t"]}))
        auth.request_reload()  # what SIGHUP does
        await wait_until(lambda: isinstance(auth.authenticate(token), Denied))
        # The watch notices a rewritten file by itself.
        watch = asyncio.get_running_loop().create_task(auth.watch())
        (tmp_path / "perms.json").write_text(json.dumps(
            {"principals": {"alice": {"grants": ["admin"]}}, "revoked_tokens": []}))
        await wait_until(lambda: isinstance(auth.authenticate(token), Identity))
        watch.cancel()

    asyncio.run(run())
