"""Signed bearer tokens: JSON Web Tokens (PyJWT, HS256) that a node verifies without a
lookup.

A token names its principal (``sub``), expires (``exp``), has an id (``jti``, what a
revocation list names) and may carry a scope of grants (``perms``, ``shared.security
.permissions``): a token can never do more than its scope, whatever the principal holds.
Keys are shared secrets of at least ``KEY_BYTES_MIN`` bytes, read from a key file with one
key per line (hex or any text): the first line signs, every line verifies, so a key is rotated
by adding the new one on top, re-issuing tokens and then removing the old one. The token's
header names its key (``kid``: a digest of the key, not the key), so verifying tries one key.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

import jwt

from shared.security.permissions import GrantError, Grants

ALGORITHM = "HS256"
ISSUER = "seqlog"
KEY_BYTES_MIN = 32
TOKEN_BYTES_MAX = 8192
"""Longest token a node looks at (an HTTP header or a HELLO field)."""
TTL_S_MAX = 10 * 366 * 86400


class TokenError(ValueError):
    """A token that is malformed, badly signed, expired or otherwise not acceptable."""


@dataclass(frozen=True, slots=True)
class TokenClaims:
    principal: str
    token_id: str
    expires_s: float
    scope: Grants | None
    """The token's own grants, or None: only the principal's."""


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"seqlog-key-id:" + key).hexdigest()[:16]


def parse_key_file(text: str) -> tuple[bytes, ...]:
    """The keys of a key file: one per non-empty line not starting with ``#``."""
    keys = tuple(line.strip().encode() for line in text.splitlines()
                 if line.strip() and not line.strip().startswith("#"))
    if not keys:
        raise TokenError("the key file holds no key")
    short = [i + 1 for i, k in enumerate(keys) if len(k) < KEY_BYTES_MIN]
    if short:
        raise TokenError(f"keys must be at least {KEY_BYTES_MIN} bytes (lines {short})")
    return keys


def new_key() -> str:
    """A fresh signing key, as a line of a key file."""
    return secrets.token_hex(32)


def mint(key: bytes, principal: str, *, ttl_s: float, scope: Sequence[str] | None = None,
         token_id: str | None = None, now_s: float | None = None) -> str:
    """A token for ``principal`` valid ``ttl_s`` seconds, limited to ``scope`` if given."""
    if not principal or len(principal) > 256:
        raise TokenError("a principal is 1 to 256 characters")
    if not 0 < ttl_s <= TTL_S_MAX:
        raise TokenError(f"ttl must be in (0, {TTL_S_MAX}] seconds")
    now = time.time() if now_s is None else now_s
    claims: dict[str, object] = {
        "iss": ISSUER, "sub": principal, "iat": int(now), "exp": int(now + ttl_s),
        "jti": token_id or secrets.token_hex(8)}
    if scope is not None:
        claims["perms"] = Grants.parse(scope).texts()
    return jwt.encode(claims, key, algorithm=ALGORITHM, headers={"kid": key_id(key)})


def verify(token: str, keys: Sequence[bytes], *, now_s: float | None = None) -> TokenClaims:
    """The claims of ``token`` if one of ``keys`` signed it and it has not expired."""
    if not token or len(token) > TOKEN_BYTES_MAX:
        raise TokenError("no token, or one over 8192 bytes")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.InvalidTokenError as exc:
        raise TokenError(f"malformed token: {exc}") from None
    kid = header.get("kid")
    key = next((k for k in keys if key_id(k) == kid), None)
    if key is None:
        raise TokenError("the token was signed by an unknown key")
    try:
        claims = jwt.decode(token, key, algorithms=[ALGORITHM], issuer=ISSUER,
                            options={"require": ["exp", "sub", "jti", "iss"],
                                     "verify_exp": now_s is None})
    except jwt.ExpiredSignatureError:
        raise TokenError("the token has expired") from None
    except jwt.InvalidTokenError as exc:
        raise TokenError(f"invalid token: {exc}") from None
    expires_s = claims["exp"]
    if now_s is not None and expires_s <= now_s:
        raise TokenError("the token has expired")
    principal, token_id = claims["sub"], claims["jti"]
    if not isinstance(principal, str) or not isinstance(token_id, str) or not principal:
        raise TokenError("invalid token: sub and jti must be strings")
    perms = claims.get("perms")
    scope = None
    if perms is not None:
        if not isinstance(perms, list):
            raise TokenError("invalid token: perms must be a list")
        try:
            scope = Grants.parse(perms)
        except GrantError as exc:
            raise TokenError(f"invalid token: {exc}") from None
    return TokenClaims(principal=principal, token_id=token_id, expires_s=float(expires_s),
                       scope=scope)
