"""The Helm chart (deploy/helm/pyserve) and the manifests it renders to (deploy/k8s, made by deploy/render.sh).

The committed manifests are checked everywhere: against the chart's values, against pyserve's own ports, flags and
health paths, and against Kubernetes' schemas where ``kubernetes-validate`` is installed. Where ``helm`` is on PATH
the chart is rendered afresh and must produce exactly the committed manifests, so they cannot drift from the chart.
tests/integration/test_deploy.py runs the Deployment's command and probes against a real server.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import pyserve
from pyserve import ServeConfig
from pyserve.cli import _parser

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
CHART = DEPLOY / "helm" / "pyserve"
EXAMPLE_VALUES = CHART / "examples" / "gpu-autoscaling.yaml"
ADAPTER_VALUES = DEPLOY / "prometheus-adapter" / "values.yaml"
# Committed render -> the values files layered on the chart's defaults to produce it (deploy/render.sh).
RENDERS: dict[str, tuple[Path, ...]] = {
    "pyserve.yaml": (),
    "pyserve-gpu-autoscaling.yaml": (EXAMPLE_VALUES,),
}
# The oldest Kubernetes the chart supports that kubernetes-validate has schemas for.
OLDEST_KUBERNETES = "1.25"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def manifests(render: str) -> list[dict[str, Any]]:
    """The objects of a committed render, in order."""
    return [doc for doc in yaml.safe_load_all((DEPLOY / "k8s" / render).read_text()) if doc]


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's values layering: maps merge key by key, anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def values_of(render: str) -> dict[str, Any]:
    values: dict[str, Any] = load_yaml(CHART / "values.yaml")
    for path in RENDERS[render]:
        values = merge(values, load_yaml(path))
    return values


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [obj for obj in objects if obj["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {[obj['metadata']['name'] for obj in found]}"
    return found[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["pyserve"]
    return dict(containers[0])


@pytest.fixture(params=sorted(RENDERS))
def render(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# the chart against pyserve ---------------------------------------------------------------------------------------


def test_chart_serves_this_pyserve_version() -> None:
    chart = load_yaml(CHART / "Chart.yaml")
    assert chart["apiVersion"] == "v2" and chart["name"] == "pyserve"
    assert chart["appVersion"] == pyserve.__version__
    assert container(manifests("pyserve.yaml"))["image"] == f"pyserve:{pyserve.__version__}"
    example_tag = load_yaml(EXAMPLE_VALUES)["image"]["tag"]
    assert container(manifests("pyserve-gpu-autoscaling.yaml"))["image"] == f"pyserve:{example_tag}"


def test_chart_ports_are_pyserves_defaults() -> None:
    defaults = ServeConfig()
    ports = load_yaml(CHART / "values.yaml")["ports"]
    assert ports == {"http": defaults.http_port, "grpc": defaults.grpc_port, "metrics": defaults.metrics_port}


def test_each_render_holds_its_objects() -> None:
    assert [obj["kind"] for obj in manifests("pyserve.yaml")] == ["ConfigMap", "Service", "Deployment"]
    assert [obj["kind"] for obj in manifests("pyserve-gpu-autoscaling.yaml")] == [
        "Service",
        "Service",
        "Deployment",
        "HorizontalPodAutoscaler",
        "ServiceMonitor",
    ]


# the Deployment ---------------------------------------------------------------------------------------------------


def test_the_container_runs_pyserve_serve_on_every_interface(render: str) -> None:
    values = values_of(render)
    spec = container(manifests(render))
    assert "command" not in spec, "the image's ENTRYPOINT (pyserve) runs; the chart gives its arguments"
    args = _parser().parse_args(spec["args"])  # exits (fails the test) on a flag pyserve does not have
    assert args.command == "serve" and args.target is None
    assert args.host == "0.0.0.0", "inside a pod pyserve must not listen on its default 127.0.0.1 only"
    assert (args.http_port, args.grpc_port, args.metrics_port) == tuple(
        values["ports"][name] for name in ("http", "grpc", "metrics")
    )
    assert args.model_repository == values["modelRepository"]["mountPath"]
    assert args.log_level == values["server"]["logLevel"]
    assert args.model_control_mode == values["server"]["modelControlMode"]
    mounts = {mount["name"]: mount for mount in spec["volumeMounts"]}
    assert mounts["model-repository"] == {
        "name": "model-repository",
        "mountPath": args.model_repository,
        "readOnly": True,
    }


def test_container_ports_are_named_after_the_listeners(render: str) -> None:
    ports = container(manifests(render))["ports"]
    assert {port["name"]: port["containerPort"] for port in ports} == values_of(render)["ports"]
    assert all(port["protocol"] == "TCP" for port in ports)


def test_http_probes_use_the_kserve_health_paths() -> None:
    values = values_of("pyserve.yaml")
    spec = container(manifests("pyserve.yaml"))
    expected = {
        "startupProbe": ("/v2/health/live", values["probes"]["startup"]),
        "livenessProbe": ("/v2/health/live", values["probes"]["liveness"]),
        "readinessProbe": ("/v2/health/ready", values["probes"]["readiness"]),
    }
    for probe_name, (path, timing) in expected.items():
        probe = dict(spec[probe_name])
        assert probe.pop("httpGet") == {"path": path, "port": "http"}, probe_name
        assert probe == timing, probe_name


def test_grpc_probes_use_the_grpc_health_service() -> None:
    values = values_of("pyserve-gpu-autoscaling.yaml")
    assert values["probes"]["kind"] == "grpc"
    spec = container(manifests("pyserve-gpu-autoscaling.yaml"))
    # Kubernetes' gRPC probe takes a port number; "" asks for the server's overall health (SERVING once ready).
    assert spec["readinessProbe"]["grpc"] == {"port": values["ports"]["grpc"], "service": ""}
    # The health service answers readiness, so liveness only checks that the gRPC listener accepts.
    assert spec["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
    assert spec["startupProbe"]["tcpSocket"] == {"port": "grpc"}


def test_pods_carry_prometheus_scrape_annotations(render: str) -> None:
    annotations = one(manifests(render), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(values_of(render)["ports"]["metrics"])
    assert annotations["prometheus.io/path"] == "/metrics"


def test_cpu_resources_are_the_values() -> None:
    values = values_of("pyserve.yaml")
    assert values["gpu"]["count"] == 0
    assert container(manifests("pyserve.yaml"))["resources"] == values["resources"]


def test_gpus_are_requested_and_limited() -> None:
    values = values_of("pyserve-gpu-autoscaling.yaml")
    gpu = {values["gpu"]["resource"]: values["gpu"]["count"]}
    assert gpu == {"nvidia.com/gpu": 1}
    resources = container(manifests("pyserve-gpu-autoscaling.yaml"))["resources"]
    # An extended resource cannot be overcommitted: its request must equal its limit.
    assert resources["requests"] == {**values["resources"]["requests"], **gpu}
    assert resources["limits"] == {**values["resources"]["limits"], **gpu}
    pod = one(manifests("pyserve-gpu-autoscaling.yaml"), "Deployment")["spec"]["template"]["spec"]
    assert pod["tolerations"] == values["tolerations"]


def test_pods_run_as_a_non_root_user_with_writable_tmp_and_shared_memory(render: str) -> None:
    values = values_of(render)
    pod = one(manifests(render), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    assert pod["automountServiceAccountToken"] is False
    spec = container(manifests(render))
    assert spec["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in spec["volumeMounts"]}
    # pyserve's sockets and Python models' files go to /tmp; large tensors through /dev/shm (64 MiB by default).
    assert volumes[mounts["/tmp"]]["emptyDir"] == {}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": values["sharedMemory"]["sizeLimit"],
    }
    assert {"name": "HOME", "value": "/tmp"} in spec["env"]


def test_termination_waits_before_sigterm(render: str) -> None:
    values = values_of(render)
    pod = one(manifests(render), "Deployment")["spec"]["template"]["spec"]
    sleep = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep == ["sleep", str(values["preStopSleepSeconds"])]
    assert values["preStopSleepSeconds"] < pod["terminationGracePeriodSeconds"]


# the model repository ---------------------------------------------------------------------------------------------


def test_the_configmap_repository_maps_every_file_to_its_path() -> None:
    values = values_of("pyserve.yaml")
    objects = manifests("pyserve.yaml")
    configmap = one(objects, "ConfigMap")
    pod = one(objects, "Deployment")["spec"]["template"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "model-repository")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    paths = {item["key"]: item["path"] for item in volume["configMap"]["items"]}
    files = {paths[key]: content for key, content in configmap["data"].items()}
    assert files == values["modelRepository"]["files"]
    assert {"add_sub/config.pbtxt", "add_sub/1/model.py"} <= set(files)
    # The pods roll when the repository changes.
    assert len(pod["metadata"]["annotations"]["checksum/model-repository"]) == 64


def test_a_volume_repository_replaces_the_configmap() -> None:
    values = values_of("pyserve-gpu-autoscaling.yaml")
    objects = manifests("pyserve-gpu-autoscaling.yaml")
    assert not [obj for obj in objects if obj["kind"] == "ConfigMap"]
    pod = one(objects, "Deployment")["spec"]["template"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "model-repository")
    assert volume == {"name": "model-repository", **values["modelRepository"]["volume"]}
    assert "checksum/model-repository" not in pod["metadata"]["annotations"]


# Services, metrics, autoscaling ------------------------------------------------------------------------------------


def test_services_expose_the_three_listeners_of_the_pods(render: str) -> None:
    values = values_of(render)
    objects = manifests(render)
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    services = [obj for obj in objects if obj["kind"] == "Service"]
    assert len(services) == (2 if values["service"]["headless"] else 1)
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items()
        ports = {port["name"]: (port["port"], port["targetPort"]) for port in service["spec"]["ports"]}
        assert ports == {name: (number, name) for name, number in values["ports"].items()}
    if values["service"]["headless"]:
        assert services[1]["spec"]["clusterIP"] == "None"


def test_the_service_monitor_scrapes_the_metrics_port() -> None:
    objects = manifests("pyserve-gpu-autoscaling.yaml")
    monitor = one(objects, "ServiceMonitor")
    service = next(obj for obj in objects if obj["kind"] == "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]


def test_the_autoscaler_scales_the_deployment_on_queue_time() -> None:
    values = values_of("pyserve-gpu-autoscaling.yaml")["autoscaling"]
    objects = manifests("pyserve-gpu-autoscaling.yaml")
    deployment = one(objects, "Deployment")
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert "replicas" not in deployment["spec"], "the autoscaler, not the chart, sets the replica count"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (values["minReplicas"], values["maxReplicas"])
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == values["queueTime"]["metricName"]
    assert metric["pods"]["target"] == {
        "type": "AverageValue",
        "averageValue": str(values["queueTime"]["targetAverageUs"]),
    }
    assert hpa["spec"]["behavior"] == values["behavior"]


def test_the_adapter_serves_the_metric_the_autoscaler_reads() -> None:
    metric_name = load_yaml(CHART / "values.yaml")["autoscaling"]["queueTime"]["metricName"]
    rules = {rule["name"]["as"]: rule for rule in load_yaml(ADAPTER_VALUES)["rules"]["custom"]}
    rule = rules[metric_name]
    # Queue time per request, per pod: Triton's cumulative counters, which pyserve exports (docs/monitoring.md).
    assert rule["seriesQuery"].startswith("nv_inference_queue_duration_us{")
    assert "rate(nv_inference_queue_duration_us{" in rule["metricsQuery"]
    assert "rate(nv_inference_request_success{" in rule["metricsQuery"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_default_renders_leave_autoscaling_and_gpus_out() -> None:
    values = values_of("pyserve.yaml")
    assert values["autoscaling"]["enabled"] is False
    assert one(manifests("pyserve.yaml"), "Deployment")["spec"]["replicas"] == values["replicaCount"]


# tools: helm, kubernetes-validate, kubectl ------------------------------------------------------------------------


def helm_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["helm", *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not on PATH: the committed renders are checked")
def test_helm_renders_exactly_the_committed_manifests(render: str) -> None:
    options = [arg for path in RENDERS[render] for arg in ("-f", str(path))]
    lint = helm_command("lint", "--strict", str(CHART), *options)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = helm_command("template", "pyserve", str(CHART), *options)
    assert rendered.returncode == 0, rendered.stderr
    fresh = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    assert fresh == manifests(render), "the chart changed: run `bash deploy/render.sh` and commit deploy/k8s"


def test_manifests_match_the_kubernetes_schemas(render: str) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed: no schema check"
    )
    versions = (OLDEST_KUBERNETES, kubernetes_validate.latest_version())
    checked = []
    for obj in manifests(render):
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # the Prometheus Operator's resource: not in Kubernetes' schemas
        for version in versions:
            kubernetes_validate.validate(obj, version, strict=True)  # strict: an unknown field is an error
        checked.append(obj["kind"])
    assert "Deployment" in checked


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
def test_kubectl_reads_the_manifests_as_written(render: str) -> None:
    # Offline: --local never asks a cluster (apply/create --dry-run=client still do, for discovery).
    path = str(DEPLOY / "k8s" / render)
    result = subprocess.run(
        ["kubectl", "annotate", "--local", "--dry-run=client", "-o", "json", "-f", path, "pyserve.test/read=true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    decoder = json.JSONDecoder()
    read: list[dict[str, Any]] = []
    text = result.stdout.strip()
    while text:
        obj, end = decoder.raw_decode(text)
        read.append(obj)
        text = text[end:].strip()
    for obj in read:
        annotations = obj["metadata"].pop("annotations")
        assert annotations.pop("pyserve.test/read") == "true"
        if annotations:
            obj["metadata"]["annotations"] = annotations
    assert read == manifests(render)
