"""The shipped Kubernetes manifests (deploy/kubernetes/): valid against the Kubernetes
API's schemas, offline and strict (kubernetes-validate); a broken one fails; and they
agree with decider itself: the ConfigMap's decider.toml is a config the daemon accepts,
the probes ask for the service decider's health reports, the ports are the ones it
listens on, and the pod outlives the drain."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from decider.client import SERVICE
from decider.config import parse_config

KUBE = Path(__file__).parent.parent / "deploy" / "kubernetes"
VALIDATE = [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet"]


def manifests() -> dict[str, dict]:
    """Every resource shipped, by kind/name."""
    return {f"{d['kind']}/{d['metadata']['name']}": d
            for path in sorted(KUBE.glob("*.yaml"))
            for d in yaml.safe_load_all(path.read_text()) if d}


def validate(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*VALIDATE, *map(str, paths)], capture_output=True, text=True)


def test_every_manifest_passes_the_kubernetes_schemas():
    out = validate(*sorted(KUBE.glob("*.yaml")))
    assert out.returncode == 0, out.stdout + out.stderr
    assert {"ConfigMap/decider-config", "Secret/decider-keys", "Deployment/decider",
            "Service/decider", "Service/decider-headless",
            "PodDisruptionBudget/decider"} <= set(manifests())


@pytest.mark.parametrize("breakage", ["a misspelled field", "a port as text"])
def test_a_broken_manifest_fails(tmp_path, breakage):
    text = (KUBE / "deployment.yaml").read_text()
    broken = text.replace("terminationGracePeriodSeconds", "terminationGracePeriod") \
        if breakage == "a misspelled field" else \
        text.replace("containerPort: 50051", "containerPort: grpc-port")
    assert broken != text
    (tmp_path / "deployment.yaml").write_text(broken)
    assert validate(tmp_path / "deployment.yaml").returncode != 0


def test_the_manifests_agree_with_the_daemon():
    m = manifests()
    cfg = parse_config(m["ConfigMap/decider-config"]["data"]["decider.toml"], "configmap")
    pod = m["Deployment/decider"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert cfg.server.listen == (f"0.0.0.0:{ports['grpc']}",)
    assert cfg.http.address == f"0.0.0.0:{ports['http']}"
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["grpc"] == {"port": ports["grpc"], "service": SERVICE}
    assert container["livenessProbe"]["grpc"]["port"] == ports["grpc"]
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > cfg.server.grace_seconds + pause
    mounts = {v["mountPath"] for v in container["volumeMounts"]}
    assert str(Path(container["args"][-1]).parent) in mounts
    assert str(Path(cfg.http.key_file).parent) in mounts
    service_ports = {p["port"] for s in ("Service/decider", "Service/decider-headless")
                     for p in m[s]["spec"]["ports"]}
    assert service_ports <= set(ports.values())
