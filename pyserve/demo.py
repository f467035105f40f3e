"""The embedded demo models ``pyserve demo`` serves: no files needed."""

from __future__ import annotations

import numpy as np

from pyserve.config import DynamicBatcher, ModelConfig, Tensor
from pyserve.decorators import batch
from pyserve.dtypes import DATATYPES, numpy_dtype
from pyserve.serve import Serve

MLP_FEATURES = 64
MLP_CLASSES = 10


@batch
def _identity(**inputs: np.ndarray) -> dict[str, np.ndarray]:
    return {"OUTPUT0": inputs["INPUT0"]}


@batch
def _add_sub(INPUT0: np.ndarray, INPUT1: np.ndarray) -> dict[str, np.ndarray]:
    return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}


class _Mlp:
    """A two-layer perceptron with fixed random weights: real numpy work that gains from batching."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = rng.standard_normal((MLP_FEATURES, 256), dtype=np.float32) / 8
        self.b1 = np.zeros(256, dtype=np.float32)
        self.w2 = rng.standard_normal((256, MLP_CLASSES), dtype=np.float32) / 16

    def __call__(self, x: np.ndarray) -> dict[str, np.ndarray]:
        hidden = np.maximum(x @ self.w1 + self.b1, 0.0)
        logits = hidden @ self.w2
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        return {"probs": probs.astype(np.float32), "label": probs.argmax(axis=1).astype(np.int64)[:, None]}


def bind_demo_models(server: Serve) -> list[str]:
    """Bind identity (FP32 and one per datatype), add_sub and mlp; returns the model names."""
    names = []
    for datatype in ("FP32", *(d for d in DATATYPES if d != "FP32")):
        name = "identity" if datatype == "FP32" else f"identity_{datatype.lower()}"
        dtype = bytes if datatype == "BYTES" else numpy_dtype(datatype)
        server.bind(
            name,
            _identity,
            inputs=[Tensor("INPUT0", dtype, (-1,))],
            outputs=[Tensor("OUTPUT0", dtype, (-1,))],
            config=ModelConfig(max_batch_size=64),
        )
        names.append(name)
    server.bind(
        "add_sub",
        _add_sub,
        inputs=[Tensor("INPUT0", np.float32, (-1,)), Tensor("INPUT1", np.float32, (-1,))],
        outputs=[Tensor("OUTPUT0", np.float32, (-1,)), Tensor("OUTPUT1", np.float32, (-1,))],
        config=ModelConfig(max_batch_size=64),
    )
    names.append("add_sub")
    server.bind(
        "mlp",
        batch(_Mlp()),
        inputs=[Tensor("x", np.float32, (MLP_FEATURES,))],
        outputs=[Tensor("probs", np.float32, (MLP_CLASSES,)), Tensor("label", np.int64, (1,))],
        config=ModelConfig(max_batch_size=128, batcher=DynamicBatcher(max_queue_delay_microseconds=500)),
    )
    names.append("mlp")
    return names


def usage_text(server: Serve, names: list[str]) -> str:
    """What the demo prints once it serves: endpoints and ready-to-paste client examples."""
    url = server.url
    host_port = url.removeprefix("http://")
    return f"""pyserve demo is serving on {url}
  models: {", ".join(names)}
  health: {url}/v2/health/ready    metadata: {url}/v2/models/add_sub    stats: {url}/v2/models/stats
  gRPC (KServe v2 / Triton): {server.grpc_address}    metrics (Prometheus): {server.metrics_url}

Try it with curl:
  curl -s -X POST {url}/v2/models/add_sub/infer -H 'Content-Type: application/json' \\
    -d '{{"inputs":[{{"name":"INPUT0","shape":[1,3],"datatype":"FP32","data":[1,2,3]}},
                   {{"name":"INPUT1","shape":[1,3],"datatype":"FP32","data":[10,20,30]}}]}}'

Or with tritonclient (pip install 'tritonclient[http]'):
  python - <<'PY'
import numpy as np, tritonclient.http as httpclient
client = httpclient.InferenceServerClient("{host_port}")
a = np.array([[1, 2, 3]], dtype=np.float32); b = np.array([[10, 20, 30]], dtype=np.float32)
inputs = [httpclient.InferInput("INPUT0", a.shape, "FP32"), httpclient.InferInput("INPUT1", b.shape, "FP32")]
inputs[0].set_data_from_numpy(a); inputs[1].set_data_from_numpy(b)
result = client.infer("add_sub", inputs)
print(result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"))
PY

Press Ctrl+C to stop."""
