"""The public API of pyserve and of pyserve.client is exactly the names below (HTTPX's and Trio's export tests do
the same)."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

import pyserve
import pyserve.client

PUBLIC_NAMES = [
    "ConstantPadder",
    "DynamicBatcher",
    "ModelConfig",
    "ModelContext",
    "PyServeError",
    "QueuePolicy",
    "RemoteServe",
    "Request",
    "RequestBatch",
    "SequenceBatcher",
    "SequenceControl",
    "SequenceState",
    "Serve",
    "ServeConfig",
    "Step",
    "Tensor",
    "TimeoutAction",
    "__version__",
    "ainfer",
    "ainfer_stream",
    "batch",
    "current_model",
    "fill_optionals",
    "first_value",
    "group_by_keys",
    "group_by_values",
    "infer",
    "infer_stream",
    "pad_batch",
    "sample",
    "sequence",
]

CLIENT_NAMES = [
    "AsyncioDecoupledModelClient",
    "AsyncioModelClient",
    "ClientClosedError",
    "ClientTimeoutError",
    "ClientTls",
    "DecoupledModelClient",
    "FuturesModelClient",
    "ModelClient",
    "RemoteModelConfig",
    "ServerUnreachableError",
]

PACKAGES = [(pyserve, PUBLIC_NAMES), (pyserve.client, CLIENT_NAMES)]
each_package = pytest.mark.parametrize(("package", "names"), PACKAGES, ids=["pyserve", "pyserve.client"])


@each_package
def test_all_lists_exactly_the_public_names(package: ModuleType, names: list[str]) -> None:
    assert package.__all__ == names


@each_package
def test_all_is_sorted_without_duplicates(package: ModuleType, names: list[str]) -> None:
    assert package.__all__ == sorted(set(package.__all__))


@each_package
def test_every_public_name_is_importable(package: ModuleType, names: list[str]) -> None:
    module = importlib.import_module(package.__name__)
    for name in package.__all__:
        assert getattr(module, name) is not None, name


@each_package
def test_public_classes_are_documented_and_claim_the_package(package: ModuleType, names: list[str]) -> None:
    for name in names:
        value = getattr(package, name)
        if name == "__version__":
            assert isinstance(value, str)
            assert value
            continue
        assert value.__doc__, f"{package.__name__}.{name} has no docstring"
        assert value.__module__.startswith("pyserve"), f"{package.__name__}.{name} comes from {value.__module__}"


def test_no_other_public_name_in_the_client_package() -> None:
    # A name a user could import from pyserve.client without it being in __all__ is an accidental API: only the
    # implementation modules (submodules) may be there besides.
    public = {name for name in vars(pyserve.client) if not name.startswith("_")}
    modules = {name for name in public if isinstance(getattr(pyserve.client, name), ModuleType)}
    assert public - modules == set(CLIENT_NAMES)


def test_errors_are_reachable_from_the_errors_module() -> None:
    errors = importlib.import_module("pyserve.errors")
    assert pyserve.PyServeError is errors.PyServeError


def test_client_errors_are_the_errors_of_pyserve_errors() -> None:
    errors = importlib.import_module("pyserve.errors")
    for name in ("ClientClosedError", "ClientTimeoutError", "ServerUnreachableError"):
        assert getattr(pyserve.client, name) is getattr(errors, name)
        assert issubclass(getattr(errors, name), errors.ClientError)
