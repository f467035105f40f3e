"""The README's Quickstart layout: the module serves when it runs, ``python quickstart.py`` or
``pyserve serve quickstart``.

``server.serve()`` blocks until Ctrl+C or SIGTERM, so importing this module serves. ``pyserve serve`` notices
that the module served while it was imported and, once it has stopped, exits (status 0) without starting it again.
Options reach it through the environment ``Serve()`` reads: ``pyserve serve quickstart --http-port 9000`` sets
``PYSERVE_HTTP_PORT``.
"""

import numpy as np

from pyserve import ModelConfig, Serve, Tensor, batch


@batch
def add_sub(INPUT0: np.ndarray, INPUT1: np.ndarray) -> dict[str, np.ndarray]:
    """Element-wise sum and difference of two FP32 batches."""
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


with Serve() as server:
    server.bind(
        "add_sub",
        add_sub,
        inputs=[Tensor("INPUT0", np.float32, (-1,)), Tensor("INPUT1", np.float32, (-1,))],
        outputs=[Tensor("OUTPUT0", np.float32, (-1,)), Tensor("OUTPUT1", np.float32, (-1,))],
        config=ModelConfig(max_batch_size=64),
    )
    server.serve()
