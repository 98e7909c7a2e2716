"""A local cluster with client authentication on (docs/SECURITY.md) for the integration tests
of tokens, permissions, quotas and limits: its key, its permissions file, and tokens of a few
principals."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from seqlog_cluster_support import READY_TIMEOUT_MS, RunningCluster

from services import local_cluster as lc
from shared.config import AuthConfig, LimitsConfig
from shared.security.tokens import mint, new_key

RELOAD_INTERVAL_MS = 100
PRINCIPALS: dict[str, dict[str, Any]] = {
    "admin": {"grants": ["admin"]},
    "reader": {"grants": ["read:*"]},
    "ranged": {"grants": ["append:1-100", "read:1-100"]},
    "metered": {"grants": ["append:*", "read:*"], "append_records_per_s": 2,
                "append_bytes_per_s": 100_000},
}
HTTP_CONNECTIONS_MAX = 64
DATA_CONNECTIONS_MAX = 64
HEAD_TIMEOUT_MS = 1_000


@dataclass
class SecureCluster:
    cluster: RunningCluster
    key: bytes
    permissions_file: Path
    tokens: dict[str, str]

    @property
    def url(self) -> str:
        return self.cluster.sequencer_urls[0]

    def token(self, principal: str, **kwargs: Any) -> str:
        return mint(self.key, principal, ttl_s=kwargs.pop("ttl_s", 3600), **kwargs)

    def write_permissions(self, revoked: list[str] | None = None) -> None:
        text = json.dumps({"principals": PRINCIPALS, "revoked_tokens": revoked or []})
        tmp = self.permissions_file.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.permissions_file)

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens['admin']}"}


def start_secure_cluster(root: Path, *, tls: bool = False) -> SecureCluster:
    """``tls``: also TLS everywhere and node authentication, as ``local up --secure``."""
    root.mkdir(parents=True, exist_ok=True)
    key = new_key()
    (root / "keys.txt").write_text(key + "\n")
    permissions = root / "permissions.json"
    secure = SecureCluster(cluster=None, key=key.encode(),  # type: ignore[arg-type]
                           permissions_file=permissions, tokens={})
    secure.write_permissions()
    spec = lc.LocalClusterSpec(
        dir=root, storage_nodes=3, sequencers=1, replication=3,
        base_port=lc.free_base_port(4), fsync="never", secure=tls,
        auth=AuthConfig(enabled=True, key_file=str(root / "keys.txt"),
                        permissions_file=str(permissions),
                        reload_interval_ms=RELOAD_INTERVAL_MS),
        limits=LimitsConfig(http_connections_max=HTTP_CONNECTIONS_MAX,
                            http_connections_per_ip_max=HTTP_CONNECTIONS_MAX // 2,
                            data_connections_max=DATA_CONNECTIONS_MAX,
                            request_head_timeout_ms=HEAD_TIMEOUT_MS))
    try:
        state = lc.up(spec, ready_timeout_ms=READY_TIMEOUT_MS)
    except lc.LocalClusterError as exc:
        pytest.fail(f"local cluster did not start:\n{exc}", pytrace=False)
    secure.cluster = RunningCluster(dir=root.resolve(), state=state)
    secure.tokens = {name: secure.token(name) for name in PRINCIPALS}
    return secure


def expired_token(key: bytes, principal: str) -> str:
    return mint(key, principal, ttl_s=60, now_s=time.time() - 3600)
