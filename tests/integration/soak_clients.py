"""The soak test's clients, run as their own process so that their memory is not counted as the server's.

``python soak_clients.py HTTP_HOST:PORT GRPC_HOST:PORT SECONDS CLIENTS STREAMERS`` drives the soak's models from
CLIENTS HTTP threads and STREAMERS gRPC stream threads until SECONDS have passed, checks every answer, and prints one
JSON line: ``{"unary": N, "stream": M, "errors": [...]}``. It stops at the first error of each thread.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from typing import Any

import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

EXPECTED = {
    "plus_one": lambda x: x + 1,
    "times_two_process": lambda x: x * 2,
    "pipeline": lambda x: (x + 1) * 2,
}


def main(url: str, grpc_address: str, duration_s: float, clients: int, streamers: int) -> dict[str, Any]:
    errors: list[str] = []
    answered = {"unary": 0, "stream": 0}
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s

    def client(index: int) -> None:
        rng = np.random.default_rng(index)
        connection = triton_http.InferenceServerClient(url, network_timeout=60, connection_timeout=60)
        try:
            while time.monotonic() < stop_at:
                model = ("plus_one", "times_two_process", "pipeline")[int(rng.integers(0, 3))]
                # Mostly small tensors; some of 160 KiB, which travel through shared memory.
                size = int(rng.choice([4, 64, 1024, 40_000], p=[0.4, 0.3, 0.2, 0.1]))
                data = rng.standard_normal((1, size)).astype(np.float32)
                tensor = triton_http.InferInput("INPUT0", [1, size], "FP32")
                tensor.set_data_from_numpy(data, binary_data=size > 64 or bool(rng.integers(0, 2)))
                got = connection.infer(model, [tensor]).as_numpy("OUTPUT0")
                if not np.allclose(got, EXPECTED[model](data)):
                    with lock:
                        errors.append(f"client {index}: wrong answer from {model} for {size} floats")
                    return
                with lock:
                    answered["unary"] += 1
        except Exception as exc:
            with lock:
                errors.append(f"client {index}: {exc!r}")
        finally:
            connection.close()

    def streamer(index: int) -> None:
        events: queue.Queue[tuple[Any, Any]] = queue.Queue()
        connection = triton_grpc.InferenceServerClient(grpc_address)
        connection.start_stream(lambda result, error: events.put((result, error)))
        try:
            number = 0
            while time.monotonic() < stop_at:
                number += 1
                tensor = triton_grpc.InferInput("INPUT0", [2], "FP32")
                tensor.set_data_from_numpy(np.full(2, number, np.float32))
                connection.async_stream_infer("count_up", [tensor], request_id=str(number))
                for step in range(3):
                    result, error = events.get(timeout=30)
                    if error is not None or result.as_numpy("OUTPUT0").tolist() != [number + step] * 2:
                        with lock:
                            errors.append(f"streamer {index}: {error or 'wrong answer'} at step {step}")
                        return
                with lock:
                    answered["stream"] += 1
        except Exception as exc:
            with lock:
                errors.append(f"streamer {index}: {exc!r}")
        finally:
            connection.stop_stream()
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    threads += [threading.Thread(target=streamer, args=(i,)) for i in range(streamers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration_s + 120)
    return {**answered, "errors": errors}


if __name__ == "__main__":
    host, grpc_host, seconds, clients, streamers = sys.argv[1:6]
    print(json.dumps(main(host, grpc_host, float(seconds), int(clients), int(streamers))), flush=True)
