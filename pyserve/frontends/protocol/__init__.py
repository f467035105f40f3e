"""The KServe v2 / Triton gRPC protocol: ``.proto`` files and the stubs generated from them.

Regenerate the stubs with ``scripts/gen_protos.sh`` after editing a ``.proto``. The messages live in ``POOL``,
pyserve's own descriptor pool: ``tritonclient`` registers the same ``inference.*`` names in protobuf's default pool,
and a process may well import both.
"""

import threading
from typing import Any

from google.protobuf import descriptor_pool, symbol_database
from google.protobuf.internal import api_implementation, builder

POOL = descriptor_pool.DescriptorPool()
_SYMBOLS = symbol_database.SymbolDatabase(pool=POOL)
_BUILDING = threading.Lock()


def build_messages(descriptor: Any, module_name: str, module: dict[str, Any]) -> None:
    """protobuf's ``builder.BuildTopDescriptorsAndMessages`` for a module of ``POOL``. Under the pure-Python
    implementation (``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``, which some libraries set) the builder also
    registers each message in protobuf's default pool, where ``tritonclient`` has the same names: the classes are
    registered in ``POOL``'s own symbol database instead. The other implementations register nothing there."""
    if api_implementation.Type() != "python":
        builder.BuildTopDescriptorsAndMessages(descriptor, module_name, module)
        return
    with _BUILDING:
        default = builder._sym_db  # type: ignore[attr-defined]
        builder._sym_db = _SYMBOLS  # type: ignore[attr-defined]
        try:
            builder.BuildTopDescriptorsAndMessages(descriptor, module_name, module)
        finally:
            builder._sym_db = default  # type: ignore[attr-defined]
