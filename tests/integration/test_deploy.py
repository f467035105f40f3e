"""deploy/ against a real pyserve: the Deployment's command, probes and scrape target, and the image's install.

- The default render's ConfigMap is laid out as the kubelet mounts it (timestamped folder, ``..data`` link, a link
  per top-level entry), and the container's arguments are run as ``pyserve`` on loopback with free ports. Every
  probe of both renders is then carried out as the kubelet would (HTTP GET, gRPC health Check, TCP connect), the
  model answers, and the metrics page holds the series the Prometheus adapter's rule reads.
- The wheel ``pip install .`` builds inside the image is built here from the files the Dockerfile copies; a slow
  test (``-m slow``) installs them into a new virtual environment, as the image's build stage does, and serves the
  Deployment's command from it.
- The image itself is built where a container engine answers (``docker info``); elsewhere that test is skipped and
  docs/deploy.md gives the command.
"""

from __future__ import annotations

import http.client
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import yaml

import pyserve
from pyserve.frontends.protocol import health_pb2, health_pb2_grpc

from .cli_process import SERVING_LINE, RunningCommand, clean_environment, pyserve_command

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
RENDERS = ("pyserve.yaml", "pyserve-gpu-autoscaling.yaml")
LISTENER_FLAGS = {"--http-port": "http", "--grpc-port": "grpc", "--metrics-port": "metrics"}


def manifests(render: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / "k8s" / render).read_text()) if doc]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [obj for obj in objects if obj["kind"] == kind]
    return found


def container(render: str) -> dict[str, Any]:
    return dict(one(manifests(render), "Deployment")["spec"]["template"]["spec"]["containers"][0])


def mount_configmap(configmap: dict[str, Any], volume: dict[str, Any], root: Path) -> None:
    """Lay the ConfigMap's items out under ``root`` as the kubelet's atomic writer does."""
    payload = root / "..2026_01_01_00_00_00.000000001"
    for item in volume["configMap"]["items"]:
        target = payload / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(configmap["data"][item["key"]])
    (root / "..data").symlink_to(payload.name)
    for entry in sorted({Path(item["path"]).parts[0] for item in volume["configMap"]["items"]}):
        (root / entry).symlink_to(Path("..data") / entry)


def local_arguments(args: list[str], repository: Path) -> list[str]:
    """The container's arguments with loopback for 0.0.0.0, free ports, and the repository's local path."""
    local = list(args)
    for flag, value in [("--host", "127.0.0.1"), ("--model-repository", str(repository))] + [
        (flag, "0") for flag in LISTENER_FLAGS
    ]:
        local[local.index(flag) + 1] = value
    return local


def http_get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def run_probe(probe: dict[str, Any], spec: dict[str, Any], ports: dict[str, int]) -> None:
    """Carry out a Kubernetes probe against the local server; ``ports`` maps listener names to its real ports."""
    numbers = {port["containerPort"]: port["name"] for port in spec["ports"]}

    def local_port(port: int | str) -> int:
        return ports[port if isinstance(port, str) else numbers[port]]

    if "httpGet" in probe:
        status, body = http_get(local_port(probe["httpGet"]["port"]), probe["httpGet"]["path"])
        assert status == 200, (probe, status, body)
    elif "grpc" in probe:
        with grpc.insecure_channel(f"127.0.0.1:{local_port(probe['grpc']['port'])}") as channel:
            request = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
            reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, probe
    else:
        socket.create_connection(("127.0.0.1", local_port(probe["tcpSocket"]["port"])), timeout=10).close()


def eventually(check: Any, timeout: float = 30.0) -> None:
    """Retry ``check`` until it passes, as a probe's period and failure threshold would."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except (AssertionError, OSError, grpc.RpcError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def series(page: str, name: str, model: str) -> float:
    """The value of ``name{model="...",...}`` on a Prometheus text page."""
    pattern = re.compile(rf'^{re.escape(name)}\{{[^}}]*model="{re.escape(model)}"[^}}]*\}} (\S+)$', re.MULTILINE)
    match = pattern.search(page)
    assert match is not None, f"no {name} for model {model!r} on the metrics page"
    return float(match.group(1))


def serve_the_deployment(pyserve_program: list[str], workdir: Path) -> None:
    """Run the default render's container command with ``pyserve_program`` and check it as Kubernetes would."""
    objects = manifests("pyserve.yaml")
    spec = container("pyserve.yaml")
    pod = one(objects, "Deployment")["spec"]["template"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "model-repository")
    repository = workdir / "models"
    repository.mkdir()
    mount_configmap(one(objects, "ConfigMap"), volume, repository)
    environment = {item["name"]: item["value"] for item in spec["env"]} | {"HOME": str(workdir)}

    command_line = [*pyserve_program, *local_arguments(spec["args"], repository)]
    with RunningCommand(command_line, workdir, env=clean_environment(**environment)) as server:
        http_port, grpc_port, metrics_port = (int(port) for port in server.wait_for(SERVING_LINE).groups())
        ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}

        # Startup and liveness answer once serving; readiness once the models are loaded.
        for render in RENDERS:
            probes = container(render)
            for name in ("startupProbe", "livenessProbe", "readinessProbe"):
                eventually(lambda probe=probes[name], spec=probes: run_probe(probe, spec, ports))

        body = orjson.dumps(
            {
                "inputs": [
                    {"name": "a", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]},
                    {"name": "b", "shape": [1, 3], "datatype": "FP32", "data": [0.5, 0.5, 0.5]},
                ]
            }
        )
        connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
        connection.request("POST", "/v2/models/add_sub/infer", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = orjson.loads(response.read())
        connection.close()
        assert response.status == 200, (answer, server.output)
        assert {out["name"]: out["data"] for out in answer["outputs"]} == {
            "sum": [1.5, 2.5, 3.5],
            "diff": [0.5, 1.5, 2.5],
        }

        # The scrape target the pod annotations name, and the counters the adapter's queue-time rule divides.
        annotations = pod["metadata"]["annotations"]
        metrics_port_of_pod = next(port["containerPort"] for port in spec["ports"] if port["name"] == "metrics")
        assert int(annotations["prometheus.io/port"]) == metrics_port_of_pod
        status, page = http_get(ports["metrics"], annotations["prometheus.io/path"])
        assert status == 200
        text = page.decode()
        assert series(text, "nv_inference_request_success", "add_sub") == 1.0
        assert series(text, "nv_inference_queue_duration_us", "add_sub") >= 0.0
        assert series(text, "nv_inference_pending_request_count", "add_sub") == 0.0

        # Kubernetes stops a pod with SIGTERM: pyserve exits cleanly.
        server.terminate()
        assert server.finish() == 0, server.output


@pytest.mark.timeout(120)
def test_the_deployment_serves_and_passes_its_probes(tmp_path: Path) -> None:
    serve_the_deployment(pyserve_command(), tmp_path)


def dockerfile_copy_sources() -> list[str]:
    """The context paths the Dockerfile COPYs (tests/unit/test_deploy_image.py checks .dockerignore admits them)."""
    sources = []
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources += line.split()[1:-1]
    return sources


def image_context(root: Path) -> Path:
    """The files the Dockerfile copies, as .dockerignore admits them (no bytecode), under ``root/context``."""
    context = root / "context"
    context.mkdir()
    for source in dockerfile_copy_sources():
        origin = REPO_ROOT / source
        if origin.is_dir():
            shutil.copytree(origin, context / source, ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]"))
        else:
            shutil.copy2(origin, context / source)
    return context


@pytest.mark.timeout(180)
def test_the_image_context_builds_the_pyserve_wheel(tmp_path: Path) -> None:
    # What `pip install .` does first in the build stage; no index needed with the build backend already here.
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=image_context(tmp_path),
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    [wheel] = tmp_path.glob(f"pyserve-{pyserve.__version__}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
        assert "pyserve = pyserve.cli:main" in archive.read(entry_points).decode()
    for needed in ("pyserve/cli.py", "pyserve/py.typed", "pyserve/frontends/protocol/health.proto"):
        assert needed in names, needed
    assert not [name for name in names if "__pycache__" in name]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_fresh_install_as_in_the_image_serves_the_deployment(tmp_path: Path) -> None:
    """The image's environment without a container engine: a new virtual environment, ``pip install .`` from the
    image's context resolving pyserve's dependencies afresh (their newest releases, not the test extras' pins), then
    the Deployment's command run from it. Slow and not hermetic (it reads the package index): run apart."""
    environment = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(environment)], check=True, timeout=120)
    install = subprocess.run(
        [str(environment / "bin" / "pip"), "install", "-q", "--no-cache-dir", "."],
        cwd=image_context(tmp_path),
        capture_output=True,
        text=True,
        timeout=480,
        check=False,
    )
    assert install.returncode == 0, install.stdout[-4000:] + install.stderr[-4000:]
    workdir = tmp_path / "run"
    workdir.mkdir()
    serve_the_deployment([str(environment / "bin" / "pyserve")], workdir)


def docker_engine() -> str | None:
    """Why the image cannot be built here, or None when a container engine answers."""
    if shutil.which("docker") is None:
        return "no docker CLI"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30, check=False)
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["docker info failed"])[-1]
        return f"no container engine ({reason}); build with: docker build -f deploy/Dockerfile -t pyserve ."
    return None


def docker_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "run", "--rm", *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.timeout(1800)
def test_the_image_builds_and_runs_pyserve_as_non_root() -> None:
    reason = docker_engine()
    if reason is not None:
        pytest.skip(reason)
    tag = f"pyserve-test:{uuid.uuid4().hex[:12]}"
    build = subprocess.run(
        ["docker", "build", "-f", str(DEPLOY / "Dockerfile"), "-t", tag, str(REPO_ROOT)],
        capture_output=True,
        text=True,
        timeout=1700,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    try:
        version = docker_run(tag, "--version")
        assert version.stdout.strip() == f"pyserve {pyserve.__version__}", version.stdout + version.stderr
        uid = docker_run("--entrypoint", "id", tag, "-u")
        assert uid.stdout.strip() == "10001", uid.stdout + uid.stderr
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, timeout=60, check=False)
