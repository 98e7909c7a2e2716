"""The Grafana dashboard and Prometheus alert rules in ``k8s/monitoring/``, as data for tests:
their PromQL expressions and the metric names those expressions use."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

MONITORING = Path(__file__).resolve().parents[2] / "k8s" / "monitoring"
DASHBOARD = MONITORING / "seqlog-dashboard.json"
RULES = MONITORING / "seqlog-alerts.yaml"
_METRIC = re.compile(r"\b(seqlog_[a-zA-Z0-9_]+)\b")


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in dashboard()["panels"] for target in panel["targets"]]


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def metric_names(exprs: list[str]) -> set[str]:
    """Every ``seqlog_*`` name in ``exprs`` (label values never start with ``seqlog_``)."""
    return {name for expr in exprs for name in _METRIC.findall(expr)}
