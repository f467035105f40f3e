"""PyTriton's API on pyserve: change ``pytriton`` to ``pyserve.pytriton`` in the imports and nothing else.

The modules carry PyTriton's module paths (``pyserve.pytriton.triton``, ``.model_config``, ``.decorators``,
``.client``, ``.proxy.types``, ``.exceptions``) and PyTriton's names, argument orders and defaults, as thin adapters
over pyserve's own ``Serve``, ``Tensor``, ``ModelConfig``, decorators and clients: there is no second server here.
docs/migrating-from-pytriton.md lists what behaves differently. Nothing in pyserve imports this package.
"""
