"""``pyserve tune``: a model started with one configuration after another, measured, and the winner written out.

The slow test serves a model whose batches take ``a + b * rows`` (20 ms + 5 ms a row) with a p99 target of 75 ms:
the cost model predicts batches of 8 (60 ms; 12 or 16 rows take 80-100 ms) on both instances, and a queue delay so
that a closed loop's requests fill those batches. tests/unit/test_bench_search.py runs the same search on the cost
model itself.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from pyserve import ModelConfig, Serve, ServeConfig, Tensor, batch
from pyserve.bench.progress import Progress
from pyserve.bench.settings import BenchSettings
from pyserve.bench.tune import ModelUnderTune, TuneSettings, run_tune
from pyserve.bench.tune_report import format_tune
from pyserve.repository.config_document import parse_config_text

from .cli_process import clean_environment, pyserve_command

pytestmark = pytest.mark.integration

APP = """
import time
import numpy as np
from pyserve import ModelConfig, Serve, Tensor, batch

@batch
def double(x):
    time.sleep(0.002)
    return {"y": x * 2}

server = Serve()
tensors = dict(inputs=[Tensor("x", np.float32, (4,))], outputs=[Tensor("y", np.float32, (4,))])
server.bind("double", double, config=ModelConfig(max_batch_size=2), **tensors)
server.bind("other", double, config=ModelConfig(max_batch_size=2), **tensors)
not_a_model = 42
"""
QUICK = (
    *("--max-instances", "1", "--kinds", "thread", "--queue-delays-us", "0", "--concurrency", "1,2"),
    *("--warmup", "0.2s", "--window", "0.3s", "--duration", "0.9s"),
)


def tune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        pyserve_command("tune", *args), cwd=cwd, env=clean_environment(), capture_output=True, text=True, timeout=180
    )


def test_tune_a_function_writes_the_table_winner_and_config(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    run = tune(
        "app:double", "--input", "x:FP32:4", "--output", "y:FP32:4", "--max-batch-size", "2",
        "--slo-p99-ms", "100", *QUICK, "--output-dir", "out", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "config 1: batch 1, 1 thread instance" in run.stderr  # the live progress
    report = json.loads((tmp_path / "out" / "tune.json").read_text())
    tried = [(trial["candidate"]["max_batch_size"], trial["candidate"]["instances"]) for trial in report["trials"]]
    assert tried == [(1, 1), (2, 1)]
    assert report["space"]["configurations"] == 2
    for trial in report["trials"]:
        assert [point["concurrency"] for point in trial["points"]] == [1, 2]
        assert trial["score_infer_per_s"] > 100
    winner = report["trials"][report["winner"] - 1]
    line = winner["model_config"]
    assert line == report["winner_model_config"] and line.startswith("ModelConfig(max_batch_size=")
    # The table, then the winner as the line to paste and as config.pbtxt.
    assert f"winner: config {report['winner']} (" in run.stdout and f"  {line}" in run.stdout
    config = parse_config_text((tmp_path / "out" / "config.pbtxt").read_text(), "double")
    assert config.name == "double" and config.max_batch_size == winner["candidate"]["max_batch_size"]
    assert [tensor.name for tensor in config.input] == ["x"] and list(config.input[0].dims) == [4]
    page = (tmp_path / "out" / "tune.html").read_text()
    assert "<svg" in page and "Pareto front" in page and "target 100 ms" in page and "config.pbtxt" in page


@pytest.mark.parametrize(
    ("target", "status", "message"),
    [
        ("app:server", 1, "the Serve binds several models (double, other): name one with --model"),
        ("app:server --model third", 1, "the Serve binds no model 'third' (it binds double, other)"),
        ("app:not_a_model", 2, "app:not_a_model is not a pyserve.Serve or a function to tune"),
        ("app:server --input x:FP32:4", 2, "--input: only for tuning a function"),
        ("no_such_module:server", 2, "cannot import 'no_such_module'"),
    ],
)
def test_tune_says_what_it_cannot_tune(tmp_path: Path, target: str, status: int, message: str) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    run = tune(*target.split(), "--slo-p99-ms", "10", cwd=tmp_path)
    assert run.returncode == status, run.stderr
    assert run.stderr.startswith("pyserve: error: ") and message in run.stderr


A_S, B_S = 0.020, 0.005


@batch
def linear_cost(x: np.ndarray) -> dict[str, np.ndarray]:
    time.sleep(A_S + B_S * len(x))
    return {"y": x}


@pytest.mark.slow
def test_tune_finds_the_configuration_the_cost_model_predicts(tmp_path: Path) -> None:
    server = Serve(ServeConfig())
    server.bind(
        "linear",
        linear_cost,
        inputs=[Tensor("x", np.float32, (4,))],
        outputs=[Tensor("y", np.float32, (4,))],
        config=ModelConfig(max_batch_size=16),
    )
    settings = TuneSettings(
        slo_p99_ms=75.0,
        bench=BenchSettings(model="linear", warmup_s=0.3, window_s=0.5, duration_s=2.0),
        max_instances=2,
        kinds=("thread",),
        queue_delays_us=(0, 2000),
        preferred=False,
        budget_s=240.0,
    )
    report = run_tune(ModelUnderTune.from_serve(server, None), settings, Progress(None))
    print("\n" + format_tune(report))
    assert report.stopped == "no neighbour did better"
    assert report.winner is not None
    candidate = report.winner.evaluation.candidate
    # Batches of 8 rows (60 ms, within 75) on both instances, filled thanks to the queue delay: 16 / 60 ms.
    assert (candidate.max_batch_size, candidate.instances, candidate.max_queue_delay_us) == (8, 2, 2000)
    assert report.winner.evaluation.score > 0.8 * 16 / (A_S + 8 * B_S)
    assert len(report.trials) < report.space.size()
