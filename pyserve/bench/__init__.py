"""Measure a served model, and find its best configuration for a latency target: ``pyserve bench`` and
``pyserve tune`` (docs/bench.md).

``bench`` drives any KServe v2 server (pyserve, Triton, PyTriton) over HTTP or gRPC from several client processes,
each an asyncio loop sending pre-encoded requests, in closed-loop (concurrency) or open-loop (request rate) steps;
it measures in windows until they are stable and reports throughput, latency percentiles and the server's own
queue/compute split. ``tune`` starts a pyserve server with one candidate ``ModelConfig`` after another, measures
each with the same machinery, and climbs towards the highest throughput whose p99 meets the target.

The modules, from the bottom up: ``settings`` (what to measure), ``inputs`` (request data from the model's
metadata), ``senders`` (one request's bytes over HTTP or gRPC), ``worker`` (a load-generating process),
``generator`` (the pool of them), ``windows`` (latency statistics and stability), ``server_stats`` (the statistics
extension), ``runner`` (steps), ``progress`` and ``report`` (what is shown and written), ``plot`` (SVG), ``search``
(the tuner's strategy), ``candidates`` (a point of the search as a ``ModelConfig`` and ``config.pbtxt``), ``tune``
(servers and evaluation), ``command`` (the command lines).
"""
