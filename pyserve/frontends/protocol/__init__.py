"""The KServe v2 / Triton gRPC protocol: ``.proto`` files and the stubs generated from them.

Regenerate the stubs with ``scripts/gen_protos.sh`` after editing a ``.proto``. The messages live in ``POOL``,
pyserve's own descriptor pool: ``tritonclient`` registers the same ``inference.*`` names in protobuf's default pool,
and a process may well import both.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
