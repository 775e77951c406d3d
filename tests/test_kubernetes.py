"""The shipped Kubernetes manifests (deploy/kubernetes/, its GPU variant in gpu/): valid
against the Kubernetes API's schemas, offline and strict (kubernetes-validate); a broken
one fails; and they agree with decider itself: each ConfigMap's decider.toml is a config
the daemon accepts, the probes ask for the service decider's health reports, the ports
are the ones it listens on, the pod outlives the drain, and the GPU variant asks for a
GPU and runs the triton engine."""

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


FILES = sorted(KUBE.rglob("*.yaml"))


def manifests() -> dict[str, dict]:
    """Every resource shipped, by kind/name."""
    return {f"{d['kind']}/{d['metadata']['name']}": d
            for path in FILES for d in yaml.safe_load_all(path.read_text()) if d}


def validate(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*VALIDATE, *map(str, paths)], capture_output=True, text=True)


def test_every_manifest_passes_the_kubernetes_schemas():
    out = validate(*FILES)
    assert out.returncode == 0, out.stdout + out.stderr
    assert {"ConfigMap/decider-config", "Secret/decider-keys", "Deployment/decider",
            "Service/decider", "Service/decider-headless", "PodDisruptionBudget/decider",
            "ConfigMap/decider-gpu-config", "Deployment/decider-gpu"} <= set(manifests())


@pytest.mark.parametrize("breakage", ["a misspelled field", "a port as text"])
def test_a_broken_manifest_fails(tmp_path, breakage):
    text = (KUBE / "deployment.yaml").read_text()
    broken = text.replace("terminationGracePeriodSeconds", "terminationGracePeriod") \
        if breakage == "a misspelled field" else \
        text.replace("containerPort: 50051", "containerPort: grpc-port")
    assert broken != text
    (tmp_path / "deployment.yaml").write_text(broken)
    assert validate(tmp_path / "deployment.yaml").returncode != 0


@pytest.mark.parametrize("deployment", ["decider", "decider-gpu"])
def test_the_manifests_agree_with_the_daemon(deployment):
    m = manifests()
    pod = m[f"Deployment/{deployment}"]["spec"]["template"]["spec"]
    [config_map] = [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v]
    cfg = parse_config(m[f"ConfigMap/{config_map}"]["data"]["decider.toml"], config_map)
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
    limits = container["resources"]["limits"]
    if deployment == "decider-gpu":
        assert limits["nvidia.com/gpu"] == 1 and cfg.model.engine == "triton"
    else:
        assert "nvidia.com/gpu" not in limits
