"""``seqlog token``: mint bearer tokens and signing keys (docs/SECURITY.md), and lay out the
credentials of a local cluster.

    seqlog token new-key > keys.txt                      # a signing key (one line)
    seqlog token create --key-file keys.txt --principal alice \\
        --perm append:1-100 --perm read:1-100 --ttl 30d  # prints the token
    seqlog token create --dir /tmp/sl --principal ops --perm admin --ttl 1h

The token id (what ``revoked_tokens`` in the permissions file names) and the expiry go to
stderr, the token to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from shared.config import AuthConfig
from shared.security.permissions import GrantError, parse_grant
from shared.security.tokens import TokenError, mint, new_key, parse_key_file, verify

AUTH_DIR = "auth"
"""Under a local cluster's directory: ``keys.txt``, ``permissions.json``, ``admin.token``."""
KEY_FILE = "keys.txt"
PERMISSIONS_FILE = "permissions.json"
ADMIN_TOKEN_FILE = "admin.token"
ADMIN_PRINCIPAL = "admin"
ADMIN_TTL_S = 365 * 86400
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``12h``, ``30d`` -> seconds."""
    unit = text[-1:] if text[-1:] in _UNITS_S else "s"
    number = text[:-1] if text[-1:] in _UNITS_S else text
    if not (number.isascii() and number.isdigit()) or int(number) < 1:
        raise argparse.ArgumentTypeError(f"expected a duration like 3600, 15m, 12h or 30d: "
                                         f"{text!r}")
    return int(number) * _UNITS_S[unit]


def _grant(text: str) -> str:
    try:
        return str(parse_grant(text))
    except GrantError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = commands.add_parser("token", help="mint bearer tokens and signing keys")
    actions = token.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="mint a signed token (printed on stdout)")
    source = create.add_mutually_exclusive_group(required=True)
    source.add_argument("--key-file", type=Path, help="signing keys (the first line signs)")
    source.add_argument("--dir", type=Path,
                        help=f"local cluster directory (uses {AUTH_DIR}/{KEY_FILE})")
    create.add_argument("--principal", required=True)
    create.add_argument("--perm", action="append", type=_grant, default=None,
                        help="grant carried by the token, e.g. append:1-100, read:*, trim:7, "
                             "admin (repeatable; none: the principal's grants in the "
                             "permissions file)")
    create.add_argument("--ttl", type=parse_ttl, default=parse_ttl("1d"),
                        help="lifetime: seconds, or 15m, 12h, 30d (default 1d)")
    actions.add_parser("new-key", help="print a fresh signing key (a line of a key file)")


def run(args: argparse.Namespace) -> int:
    if args.action == "new-key":
        print(new_key())
        return 0
    key_file = args.key_file or args.dir / AUTH_DIR / KEY_FILE
    try:
        keys = parse_key_file(Path(key_file).read_text(encoding="utf-8"))
        token = mint(keys[0], args.principal, ttl_s=args.ttl, scope=args.perm)
    except (OSError, TokenError) as exc:
        print(f"seqlog token: {exc}", file=sys.stderr)
        return 1
    claims = verify(token, keys)
    print(f"token id {claims.token_id}, principal {claims.principal}, expires "
          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(claims.expires_s))}",
          file=sys.stderr)
    print(token)
    return 0


def write_local_auth(cluster_dir: Path) -> AuthConfig:
    """Credentials for a local cluster under ``cluster_dir/auth`` (kept if already there): a
    signing key, a permissions file granting the ``admin`` principal everything, and an
    admin token. Returns the ``auth`` settings that turn authentication on with them."""
    auth_dir = cluster_dir / AUTH_DIR
    auth_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(auth_dir, 0o700)
    key_path, permissions_path = auth_dir / KEY_FILE, auth_dir / PERMISSIONS_FILE
    token_path = auth_dir / ADMIN_TOKEN_FILE
    if not key_path.exists():
        _write_private(key_path, new_key() + "\n")
    if not permissions_path.exists():
        _write_private(permissions_path, json.dumps(
            {"principals": {ADMIN_PRINCIPAL: {"grants": ["admin"]}}, "revoked_tokens": []},
            indent=2) + "\n")
    if not token_path.exists():
        keys = parse_key_file(key_path.read_text(encoding="utf-8"))
        _write_private(token_path, mint(keys[0], ADMIN_PRINCIPAL, ttl_s=ADMIN_TTL_S) + "\n")
    return AuthConfig(enabled=True, key_file=str(key_path.resolve()),
                      permissions_file=str(permissions_path.resolve()))


def local_admin_token(cluster_dir: Path) -> str | None:
    """The admin token ``write_local_auth`` left in ``cluster_dir``, if any."""
    try:
        return (cluster_dir / AUTH_DIR / ADMIN_TOKEN_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
