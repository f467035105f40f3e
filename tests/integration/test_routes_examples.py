"""``examples/from_flask``'s front-door variants start and answer as the Flask app does: the Flask app calling
``Serve.infer``, and Flask's ``/predict`` served by ``@server.route``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

pytestmark = pytest.mark.integration

FROM_FLASK = Path(__file__).resolve().parents[2] / "examples" / "from_flask"


@pytest.fixture
def compare(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``examples/from_flask/compare.py``, imported the way the example runs (its folder first on sys.path)."""
    pytest.importorskip("flask", reason="examples/from_flask needs Flask: pip install -e '.[examples]'")
    pytest.importorskip("uvicorn", reason="routes_app.py needs uvicorn: pip install -e '.[routes]'")
    monkeypatch.syspath_prepend(str(FROM_FLASK))
    for name in ("compare", "model"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("compare")


@pytest.mark.timeout(90)
def test_the_front_door_variants_answer_like_the_flask_app(compare: ModuleType) -> None:
    apps = [compare.flask_inprocess_app(compare.free_port()), compare.routes_app(compare.free_port())]
    features = compare.sample_features(1)[0]
    expected_labels, expected_scores = compare.predict(np.array([features], dtype=np.float32))
    with compare.running(apps):
        for app in apps:
            label, score = compare.predict_once(app, features)
            assert label == expected_labels[0], app.name
            assert score == pytest.approx(float(expected_scores[0]), abs=1e-4), app.name
            # A short load: concurrent requests, every answer right, the model's statistics counting them.
            result = compare.drive(app, concurrency=4, duration_s=0.5, warmup_s=0.1)
            assert result.errors == 0 and result.latencies_s, app.name
            assert result.mean_batch is not None, app.name
            # Bad input answers 400 with an error, as Flask's route does.
            status, body = _post(app.port, b'{"features": [1, 2]}')
            assert status == 400 and b"expected 256 numbers" in body, app.name


def _post(port: int, body: bytes) -> tuple[int, bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()
