"""The three models of the sentiment pipeline, numpy only, each a ``@batch`` function over a batch of rows.

- ``tokenize``: text → bag of words: lower-cased words hashed (CRC-32, stable across processes) into ``BUCKETS``
  counts.
- ``score``: bag of words → logits of ``LABELS``: a linear model whose weights come from a small built-in lexicon.
- ``label``: logits → the top label (BYTES) and its softmax confidence.

``bind_pipeline`` binds them and the ensemble ``sentiment`` (TEXT → LABEL, CONFIDENCE) on a ``Serve``.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

from pyserve import ModelConfig, Serve, Step, Tensor, batch

BUCKETS = 1024
LABELS = (b"negative", b"neutral", b"positive")
LEXICON = {
    "positive": "good great love loved excellent wonderful happy nice best amazing like enjoy fun superb",
    "negative": "bad awful hate hated terrible boring worst poor sad slow broken dull wrong ugly",
}
_WORD = re.compile(rb"[a-z']+")


def bucket(word: bytes) -> int:
    """The bag-of-words bucket of a word."""
    return zlib.crc32(word) % BUCKETS


def _weights() -> np.ndarray:
    weights = np.zeros((BUCKETS, len(LABELS)), np.float32)
    weights[:, 1] = 0.05  # an unknown word leans neutral
    for column, words in ((0, LEXICON["negative"]), (2, LEXICON["positive"])):
        for word in words.split():
            weights[bucket(word.encode()), column] += 1.0
    return weights


WEIGHTS = _weights()
BIAS = np.array([0.0, 0.5, 0.0], np.float32)


@batch
def tokenize(text: np.ndarray) -> dict[str, np.ndarray]:
    """(rows, 1) BYTES → (rows, BUCKETS) FP32 word counts."""
    counts = np.zeros((len(text), BUCKETS), np.float32)
    for row, value in enumerate(text[:, 0]):
        for word in _WORD.findall(bytes(value).lower()):
            counts[row, bucket(word)] += 1.0
    return {"counts": counts}


@batch
def score(counts: np.ndarray) -> dict[str, np.ndarray]:
    """(rows, BUCKETS) → (rows, 3) logits."""
    return {"logits": counts @ WEIGHTS + BIAS}


@batch
def label(logits: np.ndarray) -> dict[str, np.ndarray]:
    """(rows, 3) logits → (rows, 1) top label and (rows, 1) confidence."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    top = probabilities.argmax(axis=1)
    labels = np.array([[LABELS[i]] for i in top], dtype=object)
    return {"label": labels, "confidence": probabilities[np.arange(len(top)), top][:, None].astype(np.float32)}


def bind_pipeline(server: Serve, max_batch_size: int = 64) -> None:
    """Bind the three models and the ``sentiment`` ensemble that chains them inside the server."""
    config = ModelConfig(max_batch_size=max_batch_size)
    text = Tensor("text", bytes, (1,))
    counts = Tensor("counts", np.float32, (BUCKETS,))
    logits = Tensor("logits", np.float32, (len(LABELS),))
    server.bind("tokenize", tokenize, inputs=[text], outputs=[counts], config=config)
    server.bind("score", score, inputs=[counts], outputs=[logits], config=config)
    server.bind(
        "label",
        label,
        inputs=[logits],
        outputs=[Tensor("label", bytes, (1,)), Tensor("confidence", np.float32, (1,))],
        config=config,
    )
    server.bind_ensemble(
        "sentiment",
        steps=[
            Step("tokenize", inputs={"text": "TEXT"}, outputs={"counts": "counts"}),
            Step("score", inputs={"counts": "counts"}, outputs={"logits": "logits"}),
            Step("label", inputs={"logits": "logits"}, outputs={"label": "LABEL", "confidence": "CONFIDENCE"}),
        ],
        inputs=[Tensor("TEXT", bytes, (1,))],
        outputs=[Tensor("LABEL", bytes, (1,)), Tensor("CONFIDENCE", np.float32, (1,))],
        max_batch_size=max_batch_size,
    )
