"""The deployment files validate, and their probes point at what each daemon serves.

docker-compose.yml against the compose specification's schema (the copy check-jsonschema
ships: ``check-jsonschema --builtin-schema vendor.compose-spec``), deploy/'s manifests
against Kubernetes' own schemas (kubernetes-validate ships them; no cluster, no download).
Each Deployment's probes are checked against the daemon's CLI as click parses the
container's arguments (no copy of the option names here) and the probe server's routes.
"""

from __future__ import annotations

import copy
import importlib
import importlib.resources
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import pytest
import yaml

from stepledger.cli import cli
from stepledger.daemon.health import Health, probe_app

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: The Kubernetes version the manifests are checked against (kubernetes-validate ships it).
KUBERNETES = "1.33.0"
#: The daemons deploy/ runs, by the CLI command each container runs.
DAEMONS = {"project", "recover", "checkpoint", "inbox"}


def _needed(module: str) -> ModuleType:
    """A validator of the dev extra; missing, a skip on a laptop and a failure in CI."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{module} is not installed: pip install -e '.[dev]'")


def _manifests() -> dict[str, list[dict[str, Any]]]:
    """Each manifest file's resources (the kustomization is kustomize's, not a resource)."""
    files = sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    return {p.name: [r for r in yaml.safe_load_all(p.read_text()) if r] for p in files}


def _resources(kind: str) -> list[dict[str, Any]]:
    return [r for rs in _manifests().values() for r in rs if r["kind"] == kind]


# -- compose ------------------------------------------------------------------------------


def _compose_errors(document: Any) -> list[str]:
    jsonschema = _needed("jsonschema")
    _needed("check_jsonschema")
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads(vendor.joinpath("compose-spec.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    return [error.message for error in validator.iter_errors(document)]


def test_the_compose_file_matches_the_compose_specification() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert _compose_errors(compose) == []
    # The check can fail: a misspelt key in one service is found.
    broken = copy.deepcopy(compose)
    broken["services"]["recovery"]["helthcheck"] = broken["services"]["recovery"]["healthcheck"]
    assert any("helthcheck" in error for error in _compose_errors(broken))


# -- Kubernetes -------------------------------------------------------------------------


def _k8s_errors(resource: dict[str, Any]) -> str | None:
    utils = _needed("kubernetes_validate.utils")
    try:
        utils.validate(resource, KUBERNETES, strict=True)
    except utils.ValidationError as exc:
        return f"{'.'.join(map(str, exc.path))}: {exc.message}"
    except utils.SchemaNotFoundError as exc:  # an unknown kind is an error here, not a warning
        return str(exc.message)
    return None


def test_every_manifest_validates_against_kubernetes_schemas() -> None:
    manifests = _manifests()
    errors = {
        f"{name}: {r['kind']}/{r['metadata']['name']}": _k8s_errors(r)
        for name, resources in manifests.items()
        for r in resources
    }
    assert {where: e for where, e in errors.items() if e is not None} == {}
    # The check can fail: a misspelt probe is refused (strict: no unknown fields).
    deployment = copy.deepcopy(_resources("Deployment")[0])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["livenesProbe"] = container.pop("livenessProbe")
    assert "livenesProbe" in (_k8s_errors(deployment) or "")
    # `kubectl apply -k deploy/` applies every file.
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(manifests)


def _params(container: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The CLI command a container runs and its parameters, as the CLI itself parses them."""
    argv = [*container.get("command", []), *container.get("args", [])]
    assert argv[0] == "stepledger", argv
    name, args = argv[1], argv[2:]
    ctx = click.Context(cli)
    command = cli.get_command(ctx, name)
    assert command is not None, name
    with command.make_context(name, list(args), parent=ctx, resilient_parsing=True) as sub:
        return name, dict(sub.params)


def _served(path: str) -> bool:
    """Whether the probe server answers ``path`` as a probe (not its 404 listing)."""
    statuses: list[str] = []
    probe_app(Health("x"), None)({"PATH_INFO": path}, lambda s, h: statuses.append(s))
    return not statuses[0].startswith("404")


def _port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return int(number)


def test_each_deployment_probes_what_its_daemon_serves() -> None:
    config = _resources("ConfigMap")
    assert [c["metadata"]["name"] for c in config] == ["stepledger"]
    data = config[0]["data"]
    # Probes come from the kubelet: the probe server listens beyond loopback.
    assert data["STEPLEDGER_METRICS_HOST"] == "0.0.0.0" and data["STEPLEDGER_BOOTSTRAP"]
    budgets = [b["spec"]["selector"]["matchLabels"] for b in _resources("PodDisruptionBudget")]
    run: set[str] = set()
    for deployment in _resources("Deployment"):
        pod = deployment["spec"]["template"]
        assert deployment["spec"]["selector"]["matchLabels"] in budgets, deployment["metadata"]
        for container in pod["spec"]["containers"]:
            name, params = _params(container)
            run.add(name)
            sources = container["envFrom"]
            assert {"configMapRef": {"name": "stepledger"}} in sources, container["name"]
            assert container["resources"]["requests"] and container["resources"]["limits"]
            metrics_port = params["metrics_port"]
            assert metrics_port is not None, f"{container['name']} serves no probes"
            for probe in ("livenessProbe", "readinessProbe"):
                get = container[probe]["httpGet"]
                assert _served(get["path"]), (container["name"], probe, get)
                assert _port(container, get["port"]) == metrics_port, (container["name"], probe)
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            if name == "recover":
                # Pods share no volume: partition state on the recovery changelog.
                assert params["state_in_kafka"] is True
    assert run >= DAEMONS, run


def test_the_inbox_is_behind_a_service_on_its_web_port() -> None:
    (deployment,) = [
        d for d in _resources("Deployment") if d["metadata"]["name"] == "stepledger-inbox"
    ]
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "inbox"
    ]
    _, params = _params(container)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    services = [s for s in _resources("Service") if s["spec"]["selector"].items() <= labels.items()]
    assert len(services) == 1
    (port,) = services[0]["spec"]["ports"]
    assert _port(container, port["targetPort"]) == params["port"]


def test_no_credential_is_written_in_a_manifest() -> None:
    assert _resources("Secret") == []
    for rs in _manifests().values():
        for resource in rs:
            text = yaml.safe_dump(resource)
            for word in ("PASSWORD", "TOKEN", "SASL", "KEY"):
                for line in text.splitlines():
                    # A credential may be named (from a Secret), never given a value.
                    if word in line and "value:" in line:
                        raise AssertionError(f"{resource['metadata']['name']}: {line.strip()}")
