"""Plain functions, served one per command with their tensors declared on the command line (no ``Serve`` here).

    pyserve serve functions:add_sub --input INPUT0:FP32:-1 --input INPUT1:FP32:-1 \\
        --output OUTPUT0:FP32:-1 --output OUTPUT1:FP32:-1 --max-batch-size 64
    pyserve serve functions:greet --input NAME:BYTES:-1 --output GREETING:BYTES:-1

``add_sub`` is decorated with ``@batch``: it gets each input as one array of the whole batch's rows, so it is served
with ``--max-batch-size`` (requests are then batched dynamically). ``greet`` is undecorated: it gets the list of
requests and returns one dict of outputs per request, here without a batch dimension.
"""

import numpy as np

from pyserve import Request, batch


@batch
def add_sub(INPUT0: np.ndarray, INPUT1: np.ndarray) -> dict[str, np.ndarray]:
    """Element-wise sum and difference of two FP32 batches."""
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


def greet(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    """b"hello <name>" for every name of every request."""
    return [
        {"GREETING": np.array([b"hello " + name for name in request["NAME"]], dtype=object)} for request in requests
    ]
