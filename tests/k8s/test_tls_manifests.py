"""The prod overlay runs secure (issue 18, docs/SECURITY.md): every node gets the node
certificate and the cluster secret from Secrets, mounted read-only where its ``SEQLOG_TLS_*``
and ``SEQLOG_CLUSTER_SECRET_FILE`` variables point, so that its configuration has TLS and node
authentication on; probes and scrapes use HTTPS. The dev overlay stays open."""

from __future__ import annotations

from k8s_support import configmap_by_ref, container, find, pod_spec, render

from services.env_config import config_from_env


def _env(docs: list[dict[str, object]], sts: dict[str, object]) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container(sts).get("envFrom", []):
        env.update(configmap_by_ref(docs, source["configMapRef"]["name"])["data"])
    return env


def test_prod_nodes_run_with_tls_and_node_authentication() -> None:
    docs = render("overlays/prod")
    for sts in find(docs, "StatefulSet", "seqlog-s"):
        name = sts["metadata"]["name"]
        env = _env(docs, sts)
        main = container(sts)
        mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod_spec(sts)["volumes"]
                   if "secret" in v}
        for variable in ("SEQLOG_TLS_CERT_FILE", "SEQLOG_TLS_KEY_FILE", "SEQLOG_TLS_CA_FILE",
                         "SEQLOG_CLUSTER_SECRET_FILE"):
            directory = env[variable].rsplit("/", 1)[0]
            mount = mounts[directory]
            assert mount["readOnly"] is True, (name, variable)
            assert mount["name"] in secrets, (name, variable)
        assert {"seqlog-node-tls", "seqlog-cluster-secret"} <= set(secrets.values())
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in main:
                assert main[probe]["httpGet"]["scheme"] == "HTTPS", (name, probe)
        assert sts["spec"]["template"]["metadata"]["annotations"][
            "prometheus.io/scheme"] == "https"
        # The settings file is the ConfigMap's mount (test_manifests checks it): not needed here.
        env.pop("SEQLOG_SETTINGS_FILE", None)
        config = config_from_env({**env, "SEQLOG_NODE_ID": f"{name}-0",
                                  "SEQLOG_DATA_DIR": "/var/lib/seqlog"}).config
        assert config.tls.enabled and config.tls.cluster_secret_file


def test_dev_stays_open() -> None:
    docs = render("overlays/dev")
    for sts in find(docs, "StatefulSet", "seqlog-s"):
        assert not any(k.startswith("SEQLOG_TLS") for k in _env(docs, sts))
