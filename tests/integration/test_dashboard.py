"""The status page: its data against the statistics endpoint, its instances, turning it off, and the page itself in a
real browser (headless Chromium driven by Playwright), with a screenshot kept as a test artifact."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyserve import ModelConfig, Serve, ServeConfig, Tensor, batch
from pyserve.errors import ModelExecutionError

pytestmark = pytest.mark.integration

PORTS = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}
CHROMIUM = os.environ.get("PYSERVE_CHROMIUM", "/usr/bin/chromium")
# What Chromium needs to start as root in a container with no network and no display (docs/dashboard.md).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SAMPLE_S = 2.0  # pyserve.frontends.dashboard.SAMPLE_S


@batch
def double(x: np.ndarray) -> dict[str, np.ndarray]:
    if (x < 0).any():
        raise ValueError("negative input")
    return {"y": x * 2}


def bind_double(server: Serve) -> None:
    server.bind(
        "double",
        double,
        inputs=[Tensor("x", np.float32, (-1,))],
        outputs=[Tensor("y", np.float32, (-1,))],
        config=ModelConfig(max_batch_size=8),
    )


def get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read(), response.headers.get("content-type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("content-type", "")


def get_json(url: str) -> Any:
    status, body, _ = get(url)
    assert status == 200, body
    return json.loads(body)


def send_traffic(server: Serve, requests: int = 60) -> None:
    """Requests of 1 to 3 rows from 4 threads (so batches of several sizes), and one that fails in the model."""

    def client(index: int) -> None:
        for i in range(requests // 4):
            server.infer("double", {"x": np.ones((1 + (i + index) % 3, 2), np.float32)})

    threads = [threading.Thread(target=client, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    with pytest.raises(ModelExecutionError):
        server.infer("double", {"x": -np.ones((1, 2), np.float32)})


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    """A server that answered some traffic, sampled at least once since (the history shows the traffic)."""
    with Serve(ServeConfig(**PORTS, metrics_summaries=True)) as started:
        bind_double(started)
        started.run()
        send_traffic(started)
        time.sleep(SAMPLE_S + 0.5)
        yield started


def test_the_data_agrees_with_the_statistics_endpoint(server: Serve) -> None:
    data = get_json(f"{server.url}/dashboard/data")
    stats = get_json(f"{server.url}/v2/models/double/stats")["model_stats"][0]
    assert data["server"]["ready"] and data["server"]["latency"] == "quantiles"
    (model,) = data["models"]
    assert (model["name"], model["version"], model["ready"], model["max_batch_size"]) == ("double", 1, True, 8)
    assert model["stats"]["success"] == stats["inference_stats"]["success"]["count"]
    assert model["stats"]["fail"] == stats["inference_stats"]["fail"]["count"] == 1
    assert model["stats"]["inference_count"] == stats["inference_count"]
    assert model["stats"]["execution_count"] == stats["execution_count"]
    assert model["batches"] == [[b["batch_size"], b["compute_infer"]["count"]] for b in stats["batch_stats"]]
    (instance,) = model["instances"]
    assert instance == {
        "index": 0,
        "kind": "thread",
        "pid": os.getpid(),
        "device": "cpu",
        "host": platform.node(),
        "node": "",
        "restarts": 0,
        "state": "idle",
        "batches": stats["execution_count"],
    }
    assert model["latency_us"]["p50"] > 0 and model["latency_us"]["p99"] >= model["latency_us"]["p50"]
    fields, samples = data["history"]["fields"], data["history"]["samples"]
    assert len(samples) >= 2 and samples[-1]["models"]["double/1"][fields.index("success")] == model["stats"]["success"]
    assert any("failed in the model" in error["message"] for error in data["errors"])


def test_the_root_redirects_to_the_page(server: Serve) -> None:
    status, body, kind = get(f"{server.url}/")  # urllib follows the redirect
    assert (status, kind) == (200, "text/html; charset=utf-8")
    page = body.decode()
    assert "<title>pyserve status</title>" in page
    assert "<script>" in page and "<style>" in page  # inlined: the page is one request
    links = page.replace("http://www.w3.org/2000/svg", "")  # SVG's namespace is a name, not a request
    assert "http://" not in links and "https://" not in links  # no CDN


def test_process_instances_show_their_pid_device_and_restarts() -> None:
    config = ModelConfig(max_batch_size=8, instances=1, worker="process", devices=["cpu"])
    with Serve(ServeConfig(**PORTS)) as server:
        server.bind("double", double, [Tensor("x", np.float32, (-1,))], [Tensor("y", np.float32, (-1,))], config)
        server.run()
        (instance,) = get_json(f"{server.url}/dashboard/data")["models"][0]["instances"]
        assert (instance["kind"], instance["device"], instance["restarts"], instance["state"]) == (
            "process",
            "cpu",
            0,
            "idle",
        )
        os.kill(instance["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            (after,) = get_json(f"{server.url}/dashboard/data")["models"][0]["instances"]
            if (after["restarts"] == 1 and after["state"] == "idle") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert after["restarts"] == 1 and after["state"] == "idle" and after["pid"] not in (0, instance["pid"])
        data = get_json(f"{server.url}/dashboard/data")
        assert any("died" in error["message"] for error in data["errors"]), data["errors"]


def test_the_page_can_be_turned_off() -> None:
    with Serve(ServeConfig(**PORTS, dashboard=False)) as server:
        bind_double(server)
        server.run()
        for path in ("/", "/dashboard", "/dashboard/data"):
            status, body, _ = get(f"{server.url}{path}")
            assert status == 404 and b"status page is off" in body, path
        assert get(f"{server.url}/v2/health/ready")[0] == 200


# in a real browser --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set PYSERVE_CHROMIUM)")
    playwright_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs playwright (pip)")
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def test_the_page_in_a_browser_shows_the_servers_numbers(
    server: Serve, browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{server.url}/")  # redirected to /dashboard
    assert page.url.endswith("/dashboard")
    page.wait_for_function("document.body.dataset.updated", timeout=15_000)  # drawn from its first data

    stats = get_json(f"{server.url}/v2/models/double/stats")["model_stats"][0]
    row = page.locator('#models tr[data-model="double/1"]')

    def shown(field: str) -> int:
        return int(row.locator(f'[data-field="{field}"]').get_attribute("data-value"))

    assert shown("success") == stats["inference_stats"]["success"]["count"]
    assert shown("fail") == stats["inference_stats"]["fail"]["count"]
    assert shown("inference_count") == stats["inference_count"]
    assert shown("execution_count") == stats["execution_count"]
    # The text shown is the same number, formatted.
    assert row.locator('[data-field="success"]').inner_text().replace(",", "") == str(shown("success"))
    assert row.locator('[data-field="state"]').inner_text() == "ready"
    assert row.locator('[data-field="p50"]').inner_text() != "-"  # metrics_summaries: quantiles
    bars = page.locator('#batches figure[data-model="double/1"] rect')
    shown_batches = [
        [int(bars.nth(i).get_attribute("data-batch-size")), int(bars.nth(i).get_attribute("data-executions"))]
        for i in range(bars.count())
    ]
    assert shown_batches == [[b["batch_size"], b["compute_infer"]["count"]] for b in stats["batch_stats"]]
    instance = page.locator('#instances tr[data-model="double/1"]')
    assert instance.locator('[data-field="pid"]').inner_text() == str(os.getpid())
    assert instance.locator('[data-field="host"]').inner_text() == platform.node()
    assert int(instance.locator('[data-field="batches"]').get_attribute("data-value") or -1) == stats["execution_count"]
    assert page.locator("#server-state").inner_text() == "ready"
    assert float(page.locator("#total-rps").inner_text()) >= 0  # a rate between the last two samples
    assert page.locator("#chart-throughput polyline").count() >= 1
    assert "failed in the model" in page.locator("#errors").inner_text()
    assert not errors, errors

    screenshot = tmp_path_factory.mktemp("dashboard") / "dashboard.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000
    artifacts = os.environ.get("PYSERVE_TEST_ARTIFACTS")
    if artifacts:  # CI keeps it: e.g. PYSERVE_TEST_ARTIFACTS=.artifacts
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(artifacts) / "dashboard.png")
    page.close()
