"""pyserve's clients of KServe v2 / Triton servers (pyserve, Triton, PyTriton), named and behaving as PyTriton's.

``ModelClient`` (blocking), ``FuturesModelClient`` (a thread pool, futures), ``AsyncioModelClient`` (asyncio) and,
for decoupled models that stream their responses, ``DecoupledModelClient`` and ``AsyncioDecoupledModelClient``;
over HTTP (``http://host:port`` or no scheme) or gRPC (``grpc://host:port``), or over TLS (``https://``,
``grpcs://``, with ``tls=ClientTls(...)`` for a private CA or a client certificate); with ``shared_memory=True`` or
``"auto"``, a large request's tensors cross through shared memory when the server is on this host. docs/client.md
tells which to use where (BLS calls inside a model are ``pyserve.infer``).
"""

from pyserve.client.asyncio_client import AsyncioDecoupledModelClient, AsyncioModelClient
from pyserve.client.futures_client import FuturesModelClient
from pyserve.client.model import RemoteModelConfig
from pyserve.client.model_client import DecoupledModelClient, ModelClient
from pyserve.client.tls import ClientTls
from pyserve.errors import ClientClosedError, ClientTimeoutError, ServerUnreachableError

__all__ = [
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
