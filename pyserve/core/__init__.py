"""The core serving process: registry, schedulers, statistics and the front ends, on one asyncio loop.

It never runs user code. ``python -m pyserve.core`` is its entry point (spawned by ``Serve``).
"""
