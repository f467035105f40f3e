"""``import pyserve`` stays light: what a user's script, a worker process and the CLI pay at start. The clients
(``pyserve.client``) and grpcio load only when used; the worker processes import ``pyserve`` too, and a client's
protocol modules imported there would also meet ``tritonclient.grpc``'s in any module a model's function comes from
(under protobuf's pure-Python implementation the two cannot share a process)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_import_pyserve_loads_neither_the_clients_nor_grpc() -> None:
    code = "import sys, json, pyserve; print(json.dumps(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(run.stdout))
    assert "pyserve" in loaded
    assert not {name for name in loaded if name.startswith("pyserve.client")}
    assert "grpc" not in loaded and "pyserve.frontends.protocol" not in loaded
