"""The deployment files under deploy/: the Kubernetes manifest and the server command it runs.

The manifest parses, and the server command it runs is one `conveyor serve` accepts, with its token,
certificate and data where the pod mounts them.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from conveyor.cli.serve import serve

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def test_the_kubernetes_statefulset_runs_a_secured_server_on_its_mounts() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "conveyor-servers.yaml").read_text()))
    assert sorted(d["kind"] for d in docs) == ["Service", "StatefulSet"]
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    service = next(d for d in docs if d["kind"] == "Service")
    assert sts["spec"]["serviceName"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    [container] = sts["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "serve"
    params = serve.make_context("serve", list(container["args"][1:])).params  # refuses unknown options
    assert params["host"] == "0.0.0.0" and params["port"] == 7070
    mounts = [Path(m["mountPath"]) for m in container["volumeMounts"]]
    for key in ("token_file", "tls_cert", "tls_key", "data_dir"):
        path = Path(params[key])
        assert any(path == m or m in path.parents for m in mounts), f"{key} {path} is not on a mounted volume"
    claims = [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]]
    assert "data" in claims, "each server keeps its queues on a persistent volume"
