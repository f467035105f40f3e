"""``Serve.bind``'s argument checks: a mistake is a ConfigError naming the model and the value, before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

from pyserve import ModelConfig, Serve, ServeConfig, Tensor
from pyserve.errors import ConfigError

INPUTS = [Tensor("INPUT0", np.float32, (-1,))]
OUTPUTS = [Tensor("OUTPUT0", np.float32, (-1,))]


def identity(requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    return [{"OUTPUT0": request["INPUT0"]} for request in requests]


@pytest.fixture
def server() -> Serve:
    """A Serve that is never started: bind only records models until run()."""
    return Serve(ServeConfig(http_port=0, grpc_port=0, metrics_port=0))


@pytest.mark.parametrize(
    ("infer_func", "named"),
    [(42, "int 42"), ("identity", "str 'identity'"), (None, "NoneType None"), (np.zeros(2), "ndarray array")],
)
def test_bind_refuses_an_infer_func_that_is_not_callable(server: Serve, infer_func: object, named: str) -> None:
    with pytest.raises(ConfigError, match=rf"^model 'x': infer_func must be a callable .*; {named}.* is not callable"):
        server.bind("x", infer_func, INPUTS, OUTPUTS)  # type: ignore[arg-type]


def test_bind_names_the_element_of_a_list_that_is_not_callable(server: Serve) -> None:
    with pytest.raises(ConfigError, match=r"^model 'x': infer_func\[1\] is int 7, which is not callable$"):
        server.bind("x", [identity, 7], INPUTS, OUTPUTS)  # type: ignore[list-item]


def test_bind_refuses_an_empty_list_of_callables(server: Serve) -> None:
    with pytest.raises(ConfigError, match=r"^model 'x': infer_func is an empty list"):
        server.bind("x", [], INPUTS, OUTPUTS)


def test_bind_accepts_a_tuple_of_callables(server: Serve) -> None:
    server.bind("x", (identity, identity), INPUTS, OUTPUTS)


def test_bindings_lists_the_bound_models_in_order(server: Serve) -> None:
    def other(requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return identity(requests)

    server.bind("b", identity, INPUTS, OUTPUTS, config=ModelConfig(instances=2))
    server.bind("a", [identity, other], INPUTS, OUTPUTS, model_version=3)
    listed = server.bindings()
    assert [(b.spec.name, b.spec.version, b.spec.config.instances) for b in listed] == [("b", 1, 2), ("a", 3, 2)]
    assert listed[0].functions == (identity, identity)  # one per instance
    assert listed[1].functions == (identity, other)
