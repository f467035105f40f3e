"""Call add_sub with tritonclient: ``python examples/add_sub/client.py [--url 127.0.0.1:8000]``.

It answers the same against ``pyserve demo``, whose add_sub takes the same tensors.
"""

import argparse

import numpy as np
import tritonclient.http as httpclient


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="127.0.0.1:8000")
    args = parser.parse_args()
    client = httpclient.InferenceServerClient(args.url)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 10, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", a.shape, "FP32"), httpclient.InferInput("INPUT1", b.shape, "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    print("sum:\n", result.as_numpy("OUTPUT0"))
    print("difference:\n", result.as_numpy("OUTPUT1"))


if __name__ == "__main__":
    main()
