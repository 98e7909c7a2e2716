"""``k8s/monitoring/``, offline: ``promtool check rules`` (Debian's prometheus package,
installed by scripts/bootstrap.sh) accepts the alert rules, and every dashboard expression is
valid PromQL (checked by promtool as recording rules); the dashboard is one Grafana dashboard
whose panels all query the Prometheus data source variable. That every metric they name is
exported by a running node is tests/integration/test_monitoring_metrics.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml
from monitoring_support import RULES, dashboard, dashboard_exprs, metric_names, rule_exprs

PROMTOOL = shutil.which("promtool")


def _promtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None, "promtool missing: run scripts/bootstrap.sh (Debian's prometheus)"
    return subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)


def test_promtool_accepts_the_alert_rules() -> None:
    done = _promtool_check(RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    names = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"]
             for rule in group["rules"]}
    assert {"SeqlogLogNotReleasing", "SeqlogRecoveryStuck", "SeqlogNodeDead",
            "SeqlogDiskNearlyFull", "SeqlogAppendErrors"} <= names


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    """The check above can fail: a rules file with a syntax error does."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n"
                      "        expr: rate(seqlog_x[5m]\n")
    assert _promtool_check(broken).returncode != 0


def test_every_dashboard_expression_is_valid_promql(tmp_path: Path) -> None:
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"seqlog:dashboard_expr_{i}", "expr": expr}
        for i, expr in enumerate(dashboard_exprs())]}]}
    path = tmp_path / "dashboard-as-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    done = _promtool_check(path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_is_one_grafana_dashboard_over_the_prometheus_variable() -> None:
    doc = dashboard()
    assert doc["uid"] and doc["title"] and doc["panels"]
    assert [v["name"] for v in doc["templating"]["list"]] == ["datasource"]
    ids = [panel["id"] for panel in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in doc["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    wanted = {"seqlog_http_request_duration_seconds_bucket", "seqlog_sequencer_appends_in_flight",
              "seqlog_sequencer_unreleased_records_max", "seqlog_sequencer_logs_recovering",
              "seqlog_storage_small_commit_us", "seqlog_storage_fsyncs",
              "seqlog_storage_disk_bytes", "seqlog_gossip_nodes_dead",
              "seqlog_epoch_store_cas_conflicts_total",
              "seqlog_epoch_store_ambiguous_writes_total",
              "seqlog_zookeeper_connections_lost_total"}
    assert wanted <= metric_names(dashboard_exprs())
    assert metric_names(rule_exprs())
