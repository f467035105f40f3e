"""GPU placement with torch: runs only where CUDA is present (skipped with the reason elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton_http

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor

torch = pytest.importorskip("torch", reason="torch is not installed: GPU placement tests need it")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
]


class TorchDevice:
    """Loads a tensor on the device setup() is given and reports where its tensors live."""

    def setup(self, device: str) -> None:
        self.weight = torch.ones(4, device=device)

    def __call__(self, requests: list[Request]) -> list[dict[str, np.ndarray]]:
        out = []
        for request in requests:
            x = torch.as_tensor(request["INPUT0"], device=self.weight.device)
            y = (x * self.weight.sum()).cpu().numpy()
            device = str((x * 1).device).encode()
            out.append({"OUTPUT0": y, "DEVICE": np.array([[device]] * len(y), dtype=object)})
        return out


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_two_instances_on_cuda0_report_their_tensors_there(worker: str) -> None:
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as server:
        server.bind(
            "torch_device",
            TorchDevice,
            [Tensor("INPUT0", np.float32, (4,))],
            [Tensor("OUTPUT0", np.float32, (4,)), Tensor("DEVICE", bytes, (1,))],
            ModelConfig(max_batch_size=8, instances=2, devices=("cuda:0",), worker=worker),
        )
        client = triton_http.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        data = np.ones((2, 4), dtype=np.float32)
        tensor = triton_http.InferInput("INPUT0", [2, 4], "FP32")
        tensor.set_data_from_numpy(data)
        for _ in range(8):
            result = client.infer("torch_device", [tensor])
            np.testing.assert_allclose(result.as_numpy("OUTPUT0"), data * 4)
            assert {d.decode() for d in result.as_numpy("DEVICE")[:, 0]} == {"cuda:0"}
        client.close()
