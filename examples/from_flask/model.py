"""The model both apps serve: pre-processing, a small numpy MLP and post-processing.

``flask_app.py`` and ``pyserve_app.py`` import these same functions, so both servers run exactly this code; every
function takes a batch (rows along axis 0), which the Flask route calls with one row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FEATURES = 256
HIDDEN = 512
LABELS = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


class _Weights:
    """Fixed random weights (seeded, so every process builds the same model) and normalisation statistics."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.mean = rng.normal(0.0, 1.0, FEATURES).astype(np.float32)
        self.std = rng.uniform(0.5, 2.0, FEATURES).astype(np.float32)
        self.w1 = rng.normal(0.0, FEATURES**-0.5, (FEATURES, HIDDEN)).astype(np.float32)
        self.b1 = rng.normal(0.0, 0.1, HIDDEN).astype(np.float32)
        self.w2 = rng.normal(0.0, HIDDEN**-0.5, (HIDDEN, len(LABELS))).astype(np.float32)
        self.b2 = rng.normal(0.0, 0.1, len(LABELS)).astype(np.float32)


WEIGHTS = _Weights()


def parse_features(document: Any) -> np.ndarray:
    """The request JSON ``{"features": [256 numbers]}`` as a ``(1, 256)`` float32 array.

    Raises ValueError naming what is wrong, for the route to answer 400.
    """
    if not isinstance(document, dict) or "features" not in document:
        raise ValueError('expected a JSON object with a "features" list')
    features = np.asarray(document["features"], dtype=np.float32)
    if features.shape != (FEATURES,):
        raise ValueError(f"features: expected {FEATURES} numbers, got shape {features.shape}")
    return features[np.newaxis, :]


def preprocess(features: np.ndarray) -> np.ndarray:
    """Standardise each feature with the training set's mean and deviation: ``(rows, 256)`` float32."""
    return (features - WEIGHTS.mean) / WEIGHTS.std


def forward(x: np.ndarray) -> np.ndarray:
    """The MLP: 256 -> 512 (ReLU) -> 10 logits, for every row at once."""
    hidden = np.maximum(x @ WEIGHTS.w1 + WEIGHTS.b1, 0.0)
    return hidden @ WEIGHTS.w2 + WEIGHTS.b2


def postprocess(logits: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Softmax, then the top-1 label and its probability for every row."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    probabilities = np.exp(shifted)
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    best = probabilities.argmax(axis=1)
    scores = probabilities[np.arange(len(best)), best].astype(np.float32)
    return [LABELS[i] for i in best], scores


def predict(features: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Pre-process, run the model and post-process ``(rows, 256)`` features: labels and scores, one per row."""
    return postprocess(forward(preprocess(features)))
