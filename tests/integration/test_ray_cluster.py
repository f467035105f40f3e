"""Ray instances on a two-node Ray cluster (``ray.cluster_utils.Cluster``: two raylets on this host, one CPU each):
the instances land on different nodes, each is reported with its node, both serve, and when a node is lost the
other instance goes on serving. About 10 s on the 2-core development machine; in the slow suite, as it starts and
stops a cluster of its own: ``bash scripts/test.sh -m slow tests/integration/test_ray_cluster.py``."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from pyserve import ModelConfig, Request, Serve, ServeConfig, Tensor
from pyserve.client import ModelClient

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

X = [Tensor("x", np.float32, (-1,))]
PID = [Tensor("pid", np.int64, (1,))]


def which_process(requests: list[Request]) -> list[dict[str, np.ndarray]]:
    return [{"pid": np.array([os.getpid()], np.int64)} for _ in requests]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    made = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    made.add_node(num_cpus=1)
    made.wait_for_nodes()
    ray.init(address=made.address, log_to_driver=False)
    try:
        yield made
    finally:
        ray.shutdown()
        made.shutdown()


def instances(serve: Serve, model: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{serve.url}/dashboard/data", timeout=10) as response:
        data = json.loads(response.read())
    return [i for m in data["models"] if m["name"] == model for i in m["instances"]]


def test_instances_on_two_nodes_serve_and_survive_a_lost_node(cluster: Any) -> None:
    nodes = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert len(nodes) == 2
    with Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0)) as serve:
        # One CPU per actor and one per node: Ray must put the two instances on different nodes.
        config = ModelConfig(max_batch_size=0, worker="ray", instances=2, ray_actor_options={"num_cpus": 1})
        serve.bind("where", which_process, X, PID, config=config)
        placed = instances(serve, "where")
        assert {i["node"] for i in placed} == nodes and {i["kind"] for i in placed} == {"ray"}
        pids = {i["pid"] for i in placed}
        seen: set[int] = set()
        with ModelClient(serve.url, "where") as client:
            deadline = time.monotonic() + 30
            while seen != pids and time.monotonic() < deadline:
                seen.add(int(client.infer_sample(x=np.ones(1, np.float32))["pid"][0]))
        assert seen == pids  # both nodes' instances answered

        # Lose the second node: its instance goes, the head node's goes on serving.
        (worker_node,) = cluster.worker_nodes
        lost = next(i for i in placed if i["node"] != ray.get_runtime_context().get_node_id())
        cluster.remove_node(worker_node)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(i["node"] == lost["node"] for i in instances(serve, "where")):
            time.sleep(0.5)
        left = instances(serve, "where")
        assert [i["node"] for i in left] == [ray.get_runtime_context().get_node_id()], left
        with ModelClient(serve.url, "where") as client:
            answers = {int(client.infer_sample(x=np.ones(1, np.float32))["pid"][0]) for _ in range(10)}
        assert answers == {left[0]["pid"]}
