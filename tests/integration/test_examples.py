"""The examples start and answer: ``examples/from_flask`` (its Flask app and its pyserve app side by side)."""

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
    monkeypatch.syspath_prepend(str(FROM_FLASK))
    for name in ("compare", "model"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("compare")


@pytest.mark.timeout(60)
def test_from_flask_apps_start_and_answer_alike(compare: ModuleType) -> None:
    apps = [compare.flask_app(compare.free_port()), compare.pyserve_app(compare.free_port())]
    features = compare.sample_features(1)[0]
    expected_labels, expected_scores = compare.predict(np.array([features], dtype=np.float32))
    with compare.running(apps):
        answers = {app.name: compare.predict_once(app, features) for app in apps}
    for name, (label, score) in answers.items():
        assert label == expected_labels[0], name
        assert score == pytest.approx(float(expected_scores[0]), abs=1e-4), name
