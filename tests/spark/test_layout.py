"""spark_ingest's own architecture rules (the suite-wide ones in tests/architecture cover the
packages that existed before it): it depends on the public client, shared, PySpark and
pyarrow only; every module has a docstring and imports cleanly on its own. And ``seqlog
ingest`` hands every option on to the job unchanged."""

from __future__ import annotations

import argparse
import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import spark_ingest
from services import cli, ingest_cli
from spark_ingest import job

ROOT = Path(__file__).resolve().parents[2]
PROJECT = {"shared", "sequencer", "storage_node", "epoch_store", "gossip", "services", "seqlog",
           "spark_ingest", "tests", "loadtests"}
ALLOWED = {"shared", "seqlog", "spark_ingest"}


def _modules() -> list[str]:
    return ["spark_ingest", *(m.name for m in pkgutil.walk_packages(spark_ingest.__path__,
                                                                     "spark_ingest."))]


def test_depends_only_on_the_public_client_and_shared() -> None:
    for path in (ROOT / "spark_ingest").rglob("*.py"):
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path} has no module docstring"
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     and node.level == 0 else [])
            for name in names:
                root = name.split(".")[0]
                assert root not in PROJECT - ALLOWED, f"{path} imports {name}"


def test_every_module_imports_cleanly_in_a_fresh_interpreter() -> None:
    running = {module: subprocess.Popen([sys.executable, "-c", f"import {module}"], cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
               for module in _modules()}  # all at once: each pays for importing PySpark
    for module, proc in running.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{module}: {err[-2000:]}"


def test_seqlog_ingest_passes_every_option_to_the_job() -> None:
    argv = ["ingest", "--url", "http://127.0.0.1:1,http://127.0.0.1:2", "--logs", "1,5-9",
            "--to", "/o", "--checkpoint", "/c", "--trigger", "available-now",
            "--interval-ms", "250", "--master", "local[2]", "--max-records-per-trigger", "99",
            "--starting-offsets", '{"1": 5}', "--starting-timestamp-ms", "7",
            "--fail-on-data-loss", "false", "--payload-format", "json",
            "--payload-schema", "a int", "--records-per-partition", "10",
            "--records-per-read", "20", "--progress-interval-ms", "0",
            "--conf", "a=b", "--conf", "c=d"]
    args = cli.parse(argv)
    command = ingest_cli.job_argv(args, "http://127.0.0.1:7400")
    assert command[:3] == [sys.executable, "-m", "spark_ingest.job"]
    parsed = job.build_parser().parse_args(command[3:])
    for action in job.build_parser()._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert getattr(parsed, action.dest) != action.default, f"{action.dest} was not passed"
    assert parsed.url == ["http://127.0.0.1:1,http://127.0.0.1:2"]
    assert parsed.conf == ["a=b", "c=d"] and parsed.interval_ms == 250


def test_seqlog_ingest_refuses_a_directory_without_a_cluster(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    code = cli.main(["ingest", "--dir", str(tmp_path), "--logs", "1", "--to", "/o",
                     "--checkpoint", "/c"])
    assert code == 1 and "no cluster.json" in capsys.readouterr().err
