"""The core serving process: registry, schedulers, batches in flight, worker control and statistics, on one asyncio
loop.

It never runs user code. ``python -m pyserve.core`` is its entry point (spawned by ``Serve``): it builds the
``CoreServer`` and starts the front ends (``pyserve.frontends``) with the core's ``CoreApi`` (``api.py``).
"""
