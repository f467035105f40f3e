"""pyserve-form model: ``infer_func`` is a class set up in its instance, served with @batch; the module declares
its tensors and configuration for a repository without config.pbtxt."""

import numpy as np

from pyserve import ModelConfig, Tensor, batch

inputs = [Tensor("x", np.float32, (-1,))]
outputs = [Tensor("y", np.float32, (-1,))]
config = ModelConfig(max_batch_size=16)


class Scale:
    """Multiplies by a factor chosen in setup(device)."""

    def setup(self, device):
        self.factor = 3.0 if device == "cpu" else 0.0

    @batch
    def __call__(self, x):
        return {"y": x * self.factor}


infer_func = Scale
