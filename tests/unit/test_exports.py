"""The public API of pyserve is exactly the names below (HTTPX's and Trio's export tests do the same)."""

from __future__ import annotations

import importlib

import pyserve

PUBLIC_NAMES = [
    "ConstantPadder",
    "DynamicBatcher",
    "ModelConfig",
    "ModelContext",
    "PyServeError",
    "QueuePolicy",
    "Request",
    "RequestBatch",
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
]


def test_all_lists_exactly_the_public_names() -> None:
    assert pyserve.__all__ == PUBLIC_NAMES


def test_all_is_sorted_without_duplicates() -> None:
    assert pyserve.__all__ == sorted(set(pyserve.__all__))


def test_every_public_name_is_importable() -> None:
    module = importlib.import_module("pyserve")
    for name in pyserve.__all__:
        assert getattr(module, name) is not None, name


def test_public_classes_are_documented_and_claim_the_package() -> None:
    for name in PUBLIC_NAMES:
        value = getattr(pyserve, name)
        if name == "__version__":
            assert isinstance(value, str)
            assert value
            continue
        assert value.__doc__, f"pyserve.{name} has no docstring"
        assert value.__module__.startswith("pyserve"), f"pyserve.{name} comes from {value.__module__}"


def test_errors_are_reachable_from_the_errors_module() -> None:
    errors = importlib.import_module("pyserve.errors")
    assert pyserve.PyServeError is errors.PyServeError
