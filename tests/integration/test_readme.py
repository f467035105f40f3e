"""The README's examples run as written: its "Calling it" snippets against ``pyserve demo`` and against its Quickstart.

Blocks are found by the ``<!-- readme-test: NAME -->`` comment above them. The servers listen on free ports, so the
snippets' ``127.0.0.1:8000`` is replaced with the real address; nothing else is changed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from .cli_process import FREE_PORTS, SERVING_LINE, RunningCommand, clean_environment, pyserve_command

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
DOCUMENTED_ADDRESS = "127.0.0.1:8000"
DEMO_BANNER = re.compile(r"pyserve demo is serving on http://127\.0\.0\.1:(\d+)")


def readme_block(name: str) -> str:
    """The fenced block right after ``<!-- readme-test: name -->`` in the README."""
    text = README.read_text()
    match = re.search(rf"<!-- readme-test: {re.escape(name)} -->\n```[a-z]*\n(.*?)\n```", text, re.DOTALL)
    assert match, f"README.md has no fenced block marked <!-- readme-test: {name} -->"
    return match.group(1)


def at_address(snippet: str, address: str) -> str:
    assert DOCUMENTED_ADDRESS in snippet, f"the snippet no longer calls {DOCUMENTED_ADDRESS}:\n{snippet}"
    return snippet.replace(DOCUMENTED_ADDRESS, address)


@pytest.fixture(scope="module", params=["demo", "quickstart"])
def add_sub_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a running server with add_sub: ``pyserve demo``, or the README's Quickstart saved as a file."""
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "demo":
        command = RunningCommand(pyserve_command("demo", *FREE_PORTS), folder)
        pattern = DEMO_BANNER
    else:
        (folder / "add_sub.py").write_text(readme_block("quickstart") + "\n")
        env = clean_environment(PYSERVE_HTTP_PORT="0", PYSERVE_GRPC_PORT="0", PYSERVE_METRICS_PORT="0")
        command = RunningCommand([sys.executable, "add_sub.py"], folder, env)
        # The Quickstart configures no logging, so its address line comes on stderr by itself.
        pattern = SERVING_LINE
    try:
        port = int(command.wait_for(pattern).group(1))
        yield f"127.0.0.1:{port}"
        command.terminate()
        assert command.finish() == 0, command.output
    finally:
        command.close()


@pytest.mark.timeout(90)
def test_python_client_snippet(add_sub_server: str, tmp_path: Path) -> None:
    snippet = at_address(readme_block("client-python"), add_sub_server)
    result = subprocess.run(
        [sys.executable, "-c", snippet],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=clean_environment(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[11. 22. 33.]] [[ -9. -18. -27.]]"
    # The README shows what it prints.
    assert "# [[11. 22. 33.]] [[ -9. -18. -27.]]" in snippet


@pytest.mark.timeout(90)
def test_curl_snippet(add_sub_server: str) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    snippet = at_address(readme_block("client-curl"), add_sub_server)
    result = subprocess.run(["bash", "-c", snippet], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    outputs = {output["name"]: output for output in orjson.loads(result.stdout)["outputs"]}
    assert outputs["OUTPUT0"]["data"] == [11.0, 22.0, 33.0]
    assert outputs["OUTPUT1"]["data"] == [-9.0, -18.0, -27.0]
    assert outputs["OUTPUT0"]["shape"] == [1, 3]


@pytest.mark.timeout(90)
def test_demo_banner_names_every_endpoint(tmp_path: Path) -> None:
    command = RunningCommand(pyserve_command("demo", *FREE_PORTS), tmp_path)
    try:
        command.wait_for(DEMO_BANNER)
        metrics = command.wait_for(r"metrics \(Prometheus\): (http://127\.0\.0\.1:\d+/metrics)").group(1)
        command.wait_for(r"gRPC \(KServe v2 / Triton\): 127\.0\.0\.1:\d+")
        with urllib.request.urlopen(metrics, timeout=30) as response:
            assert b"nv_inference_count" in response.read()
        command.terminate()
        assert command.finish() == 0
    finally:
        command.close()
