"""A module that makes a ``Serve`` and binds its models on import, without starting it: ``pyserve serve app:server``.

The command starts it, applies its options (``--http-port 9000`` replaces that one field of the config below), and
stops it on Ctrl+C or SIGTERM. ``python -c "import app"`` starts nothing.
"""

import numpy as np

from pyserve import ModelConfig, Serve, ServeConfig, Tensor, batch


@batch
def add_sub(INPUT0: np.ndarray, INPUT1: np.ndarray) -> dict[str, np.ndarray]:
    """Element-wise sum and difference of two FP32 batches."""
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


server = Serve(ServeConfig.from_env(max_request_bytes=1 << 20))
server.bind(
    "add_sub",
    add_sub,
    inputs=[Tensor("INPUT0", np.float32, (-1,)), Tensor("INPUT1", np.float32, (-1,))],
    outputs=[Tensor("OUTPUT0", np.float32, (-1,)), Tensor("OUTPUT1", np.float32, (-1,))],
    config=ModelConfig(max_batch_size=64),
)
