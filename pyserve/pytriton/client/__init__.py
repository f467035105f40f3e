"""PyTriton's ``pytriton.client``: pyserve's clients (``pyserve.client``), which take PyTriton's arguments and
behave as PyTriton's do, against pyserve, Triton or PyTriton servers alike (docs/client.md).

The errors they raise are pyserve's (``pyserve.errors``); ``pyserve.pytriton.client.exceptions`` names them as
PyTriton does, so ``except PyTritonClientTimeoutError`` keeps working.
"""

from __future__ import annotations

from pyserve.client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)

__all__ = [
    "AsyncioDecoupledModelClient",
    "AsyncioModelClient",
    "DecoupledModelClient",
    "FuturesModelClient",
    "ModelClient",
]
