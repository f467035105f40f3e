"""Classify a few random rows with tritonclient: ``python examples/openvino/client.py [--url 127.0.0.1:8000]``.

Prints the top class of each row and how far the served probabilities are from numpy's (``model.reference``); exits
with status 1 when they differ by more than 1e-5.
"""

import argparse
import sys

import numpy as np
import tritonclient.http as httpclient
from model import FEATURES, MODEL_NAME, reference

TOLERANCE = 1e-5


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="127.0.0.1:8000")
    parser.add_argument("--rows", type=int, default=4)
    args = parser.parse_args()
    features = np.random.default_rng(0).standard_normal((args.rows, FEATURES)).astype(np.float32)
    tensor = httpclient.InferInput("features", list(features.shape), "FP32")
    tensor.set_data_from_numpy(features)
    with httpclient.InferenceServerClient(args.url) as client:
        probabilities = client.infer(MODEL_NAME, [tensor]).as_numpy("probabilities")
    for row, scores in enumerate(probabilities):
        print(f"row {row}: class {int(scores.argmax())} (p={float(scores.max()):.3f})")
    difference = float(np.abs(probabilities - reference(features)["probabilities"]).max())
    print(f"max |served - numpy| = {difference:.2e}")
    return 0 if difference <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
