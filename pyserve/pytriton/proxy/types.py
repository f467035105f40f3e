"""PyTriton's ``pytriton.proxy.types``: what an infer function receives.

``Request`` is pyserve's own: a mapping of input names to arrays (``request["x"]``, ``.data``) with the request's
``.parameters`` (forwarded headers included, see ``TritonConfig.http_header_forward_pattern``) and
``.requested_output_names``. An infer function returns one output dict per request, as PyTriton's do.
"""

from __future__ import annotations

from pyserve.request import Request

Requests = list[Request]

__all__ = ["Request", "Requests"]
