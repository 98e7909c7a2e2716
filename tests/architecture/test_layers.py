"""The architecture is enforced by machines: layers, pure cores, no circular imports."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "sequencer", "storage_node", "epoch_store", "gossip", "services", "seqlog",
            "frontend")
DOMAINS = ("sequencer", "storage_node", "epoch_store", "gossip", "frontend")
BANNED_IN_CORES = {"asyncio", "aiohttp", "time", "random", "socket", "os", "threading"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _pure_modules() -> list[Path]:
    cores = [p for d in DOMAINS for p in (ROOT / d / "core").glob("*.py")]
    shared = [ROOT / "shared" / f for f in ("types.py", "status.py", "limits.py",
                                             "read_merge.py", "routing.py", "effects.py")]
    return cores + shared + list((ROOT / "shared" / "wire").glob("*.py"))


@pytest.mark.parametrize("path", _pure_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_modules_do_no_io(path: Path) -> None:
    roots = {name.split(".")[0] for name in _imports(path)}
    assert not roots & BANNED_IN_CORES, f"{path} imports {roots & BANNED_IN_CORES}"
    assert "shared.net" not in _imports(path)


@pytest.mark.parametrize("domain", DOMAINS)
def test_domains_import_only_shared(domain: str) -> None:
    for path in (ROOT / domain).rglob("*.py"):
        for name in _imports(path):
            root = name.split(".")[0]
            assert root not in set(PACKAGES) - {"shared", domain}, f"{path} imports {name}"


def test_client_depends_on_shared_only() -> None:
    for path in (ROOT / "seqlog").rglob("*.py"):
        for name in _imports(path):
            assert name.split(".")[0] not in set(PACKAGES) - {"shared", "seqlog"}, (path, name)


def test_import_linter_contracts() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_module_imports_cleanly_in_a_fresh_interpreter() -> None:
    modules = []
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        modules.append(package)
        modules += [m.name for m in pkgutil.walk_packages(pkg.__path__, f"{package}.")]
    for module in modules:
        result = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{module}: {result.stderr[-2000:]}"


def test_every_module_has_a_docstring() -> None:
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            assert ast.get_docstring(tree), f"{path} has no module docstring"
