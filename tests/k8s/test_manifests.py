"""The Kubernetes manifests render (kustomize) and validate offline against the Kubernetes
schemas (kubernetes-validate, strict), and hold together: node counts, ports, probes,
security settings, disruption budgets, selectors and the shutdown bound all agree."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from k8s_support import (
    K8S_VERSIONS,
    OVERLAYS,
    Manifest,
    configmap_by_ref,
    container,
    find,
    kubernetes_validate_module,
    one,
    pod_spec,
    render,
    render_text,
    validation_errors,
)

from services.env_config import config_from_env

TARGETS = ("base", *(f"overlays/{o}" for o in OVERLAYS))
EXPECTED_COUNTS = {
    "overlays/dev": {"seqlog-zk": 1, "seqlog-storage": 3, "seqlog-sequencer": 2},
    "overlays/prod": {"seqlog-zk": 3, "seqlog-storage": 5, "seqlog-sequencer": 3},
}
SHUTDOWN_MARGIN_S = 5
"""Time the kubelet's SIGKILL must still be away when the node's own shutdown bound ends."""


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_renders_and_validates_offline(target: str, version: str) -> None:
    docs = render(target)
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget",
            "NetworkPolicy"} <= kinds
    assert validation_errors(docs, version) == []


def test_the_validator_rejects_broken_manifests() -> None:
    """The schema check can fail: wrong types, missing required fields and (strict) unknown
    fields are all reported."""
    statefulset = one(render("overlays/dev"), "StatefulSet", "seqlog-storage")
    wrong_type = copy.deepcopy(statefulset)
    wrong_type["spec"]["replicas"] = "three"
    no_selector = copy.deepcopy(statefulset)
    del no_selector["spec"]["selector"]
    unknown_field = copy.deepcopy(statefulset)
    unknown_field["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    for broken in (wrong_type, no_selector, unknown_field):
        errors = validation_errors([broken], K8S_VERSIONS[-1])
        assert len(errors) == 1 and "StatefulSet/seqlog-storage" in errors[0]


def test_the_command_line_validator_accepts_the_rendered_stream() -> None:
    """The documented pipeline: ``kustomize build ... | kubernetes-validate --strict -``."""
    kubernetes_validate_module()
    for overlay in OVERLAYS:
        result = subprocess.run(
            [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", "--quiet",
             "-k", K8S_VERSIONS[-1], "-"],
            input=render_text(f"overlays/{overlay}"), capture_output=True, text=True,
            timeout=120, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_node_counts_match_between_statefulsets_configmap_and_zookeeper(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    counts = {s["metadata"]["name"]: s["spec"]["replicas"] for s in find(docs, "StatefulSet")}
    assert counts == EXPECTED_COUNTS[f"overlays/{overlay}"]
    for sts in find(docs, "StatefulSet", "seqlog-s"):
        env = _configmap_env(docs, sts)
        role = sts["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        assert env[f"SEQLOG_{role.upper()}_SET"] == sts["metadata"]["name"]
        assert int(env[f"SEQLOG_{role.upper()}_REPLICAS"]) == sts["spec"]["replicas"]
    zookeeper = one(docs, "StatefulSet", "seqlog-zk")
    zoo_cfg = one(docs, "ConfigMap", "seqlog-zk-config")["data"]["zoo.cfg"]
    servers = sorted(line.split("=", 1)[1] for line in zoo_cfg.splitlines()
                     if line.startswith("server."))
    assert servers == [f"seqlog-zk-{i}.seqlog-zk-headless:2888:3888"
                       for i in range(zookeeper["spec"]["replicas"])]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_gets_a_valid_node_config_with_one_cluster_fingerprint(
        overlay: str, tmp_path: Path) -> None:
    """Each pod's environment, as the kubelet builds it, passes services.env_config, and every
    node derives the same cluster (same fingerprint), with its node id from its pod name."""
    docs = render(f"overlays/{overlay}")
    fingerprints = set()
    ids = set()
    for sts in find(docs, "StatefulSet", "seqlog-s"):
        for ordinal in range(sts["spec"]["replicas"]):
            pod_name = f"{sts['metadata']['name']}-{ordinal}"
            env = _pod_env(docs, sts, pod_name, tmp_path)
            node = config_from_env(env)
            assert node.config.node_id == pod_name
            assert node.listen_host == "0.0.0.0"
            assert node.config.me.host == (
                f"{pod_name}.seqlog-nodes.{sts['metadata']['namespace']}.svc.cluster.local")
            assert node.config.epoch_store == "zk://seqlog-zk-client:2181/seqlog"
            fingerprints.add(node.config.cluster.fingerprint())
            ids.add(pod_name)
            expected_settings = json.loads(one(docs, "ConfigMap", "seqlog-settings")["data"]
                                           ["settings.json"])
            assert (node.config.cluster.replication_factor
                    == expected_settings["cluster"]["replication_factor"])
    assert len(fingerprints) == 1
    assert ids == {n.node_id for n in config_from_env(env).config.cluster.nodes}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_locked_down_probed_limited_and_scraped(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    for sts in find(docs, "StatefulSet"):
        spec = pod_spec(sts)
        main = container(sts)
        name = sts["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] > 0, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert spec["automountServiceAccountToken"] is False, name
        security = main["securityContext"]
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["capabilities"]["drop"] == ["ALL"], name
        resources = main["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), name
        assert "memory" in resources["limits"], name
        annotations = sts["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", name
        assert int(annotations["prometheus.io/port"]) in {
            p["containerPort"] for p in main["ports"]}, name
        assert "readinessProbe" in main and "livenessProbe" in main, name
        assert sts["spec"]["updateStrategy"]["type"] == "RollingUpdate", name
        assert sts["spec"]["minReadySeconds"] > 0, name
    for sts in find(docs, "StatefulSet", "seqlog-s"):
        main = container(sts)
        assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert main["command"] == ["python", "-m", "services.node", "--from-env"]
        assert pod_spec(sts)["enableServiceLinks"] is False
        env = _configmap_env(docs, sts)
        grace_s = pod_spec(sts)["terminationGracePeriodSeconds"]
        assert int(env["SEQLOG_SHUTDOWN_TIMEOUT_MS"]) / 1000 + SHUTDOWN_MARGIN_S <= grace_s
    storage = one(docs, "StatefulSet", "seqlog-storage")
    claims = storage["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data"]
    mounts = {m["name"]: m["mountPath"] for m in container(storage)["volumeMounts"]}
    assert mounts["data"] == _configmap_env(docs, storage).get(
        "SEQLOG_DATA_DIR", _env_value(storage, "SEQLOG_DATA_DIR"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_budgets_services_and_network_policy_hold_together(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    statefulsets = find(docs, "StatefulSet")

    def selected(selector: dict[str, str]) -> list[str]:
        return [s["metadata"]["name"] for s in statefulsets
                if all(s["spec"]["template"]["metadata"]["labels"].get(k) == v
                       for k, v in selector.items())]

    for sts in statefulsets:
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in sts["spec"]["selector"]["matchLabels"].items())
        governing = one(docs, "Service", sts["spec"]["serviceName"])
        assert governing["spec"]["clusterIP"] == "None"
        assert governing["spec"]["publishNotReadyAddresses"] is True
        assert sts["metadata"]["name"] in selected(governing["spec"]["selector"])
    for pdb in find(docs, "PodDisruptionBudget"):
        targets = selected(pdb["spec"]["selector"]["matchLabels"])
        assert len(targets) == 1, pdb["metadata"]["name"]
        assert pdb["spec"]["maxUnavailable"] == 1
    assert {p["metadata"]["name"] for p in find(docs, "PodDisruptionBudget")} == {
        s["metadata"]["name"] for s in statefulsets}
    assert selected(one(docs, "Service", "seqlog")["spec"]["selector"]) == ["seqlog-sequencer"]
    assert selected(one(docs, "Service", "seqlog-zk-client")["spec"]["selector"]) == [
        "seqlog-zk"]
    for policy in find(docs, "NetworkPolicy"):
        targets = [s for s in statefulsets
                   if s["metadata"]["name"] in selected(policy["spec"]["podSelector"]
                                                        ["matchLabels"])]
        assert targets and policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"]["ingress"]:
            for port in rule["ports"]:
                for sts in targets:
                    names = {p["name"] for p in container(sts)["ports"]}
                    assert port["port"] in names, (policy["metadata"]["name"], port)
            for peer in rule["from"]:
                # Only Seqlog/ZooKeeper pods themselves, or labelled clients.
                labels = peer["podSelector"]["matchLabels"]
                assert selected(labels) or labels == {"seqlog.io/client": "true"}
    for service in find(docs, "Service"):
        assert selected(service["spec"]["selector"]), service["metadata"]["name"]


def test_prod_spreads_every_kind_over_distinct_kubernetes_nodes() -> None:
    docs = render("overlays/prod")
    for sts in find(docs, "StatefulSet"):
        terms = pod_spec(sts)["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert any(t["topologyKey"] == "kubernetes.io/hostname"
                   and all(labels.get(k) == v
                           for k, v in t["labelSelector"]["matchLabels"].items())
                   for t in terms), sts["metadata"]["name"]


def _configmap_env(docs: list[Manifest], sts: Manifest) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container(sts).get("envFrom", []):
        env.update(configmap_by_ref(docs, source["configMapRef"]["name"])["data"])
    return env


def _env_value(sts: Manifest, name: str) -> str:
    for item in container(sts)["env"]:
        if item["name"] == name:
            return str(item["value"])
    raise AssertionError(f"{name} not in the container's env")


def _pod_env(docs: list[Manifest], sts: Manifest, pod_name: str, tmp_path: Path
             ) -> dict[str, str]:
    """The kubelet's environment for ``pod_name``, with the settings ConfigMap's file put
    where the mount would put it."""
    from pods_on_one_machine import expand
    env = _configmap_env(docs, sts)
    fields = {"metadata.name": pod_name, "metadata.namespace": sts["metadata"]["namespace"]}
    for item in container(sts)["env"]:
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    for mount in container(sts)["volumeMounts"]:
        volume = volumes.get(mount["name"], {})
        if "configMap" in volume and env["SEQLOG_SETTINGS_FILE"].startswith(mount["mountPath"]):
            data = configmap_by_ref(docs, volume["configMap"]["name"])["data"]
            key = env["SEQLOG_SETTINGS_FILE"][len(mount["mountPath"]):].lstrip("/")
            path = tmp_path / f"{pod_name}-{key}"
            path.write_text(data[key])
            env["SEQLOG_SETTINGS_FILE"] = str(path)
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prod_requires_tokens_from_a_mounted_secret_and_dev_stays_open(
        overlay: str, tmp_path: Path) -> None:
    """docs/SECURITY.md: the prod overlay turns client authentication on with the keys and
    permissions of the seqlog-auth Secret, mounted read-only into every Seqlog pod; the dev
    overlay stays open for a first try."""
    docs = render(f"overlays/{overlay}")
    for sts in find(docs, "StatefulSet", "seqlog-s"):
        pod_name = f"{sts['metadata']['name']}-0"
        auth = config_from_env(_pod_env(docs, sts, pod_name, tmp_path)).config.auth
        if overlay == "dev":
            assert not auth.enabled
            continue
        assert auth.enabled and auth.key_file == "/etc/seqlog-auth/keys.txt"
        assert auth.permissions_file == "/etc/seqlog-auth/permissions.json"
        mounts = {m["name"]: m for m in container(sts)["volumeMounts"]}
        assert mounts["auth"]["mountPath"] == "/etc/seqlog-auth"
        assert mounts["auth"]["readOnly"] is True
        volume = next(v for v in pod_spec(sts)["volumes"] if v["name"] == "auth")
        assert volume["secret"]["secretName"] == "seqlog-auth"
        assert volume["secret"]["defaultMode"] == 0o440
    if overlay == "prod":
        secret = one(docs, "Secret", "seqlog-auth")
        assert set(secret["stringData"]) == {"keys.txt", "permissions.json", "admin.token"}
