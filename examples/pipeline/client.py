"""Call the ``sentiment`` ensemble with tritonclient: ``python examples/pipeline/client.py [--url 127.0.0.1:8000]``.

One request carries several texts (one row each); the server tokenizes, scores and labels them in one round trip.
"""

import argparse

import numpy as np
import tritonclient.http as httpclient

TEXTS = ["I love this, what a wonderful day", "This was boring and awful", "The train leaves at nine"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="127.0.0.1:8000")
    parser.add_argument("texts", nargs="*", default=TEXTS)
    args = parser.parse_args()
    client = httpclient.InferenceServerClient(args.url)
    text = np.array([[t.encode()] for t in args.texts], dtype=object)
    tensor = httpclient.InferInput("TEXT", list(text.shape), "BYTES")
    tensor.set_data_from_numpy(text)
    result = client.infer("sentiment", [tensor])
    for value, label, confidence in zip(
        args.texts, result.as_numpy("LABEL")[:, 0], result.as_numpy("CONFIDENCE")[:, 0], strict=True
    ):
        print(f"{label.decode():>8} {confidence:.2f}  {value}")


if __name__ == "__main__":
    main()
