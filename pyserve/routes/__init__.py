"""Front doors for existing applications, in the ``Serve`` process: custom JSON routes and the KServe v2 ASGI app.

- ``Serve.route(path, methods)`` declares a handler (``table``); ``RoutesServer`` (``server``) serves the declared
  routes with uvicorn + Starlette (``app``) on ``ServeConfig.routes_port``, in a thread of the ``Serve`` process, so
  user code never runs in the core. Handlers call models through the in-process API (``Serve.infer`` /
  ``ainfer``); the routes' own counters (``metrics``) are on the routes port's ``/metrics``.
- ``Serve.asgi_app()`` (``kserve_app``) is a Starlette app with the KServe v2 routes, infer going through the
  in-process API, to mount into an application run under the user's own ASGI server.

Starlette and uvicorn are imported only here, and only when a route is served: ``pip install 'pyserve[routes]'``.
docs/routes.md describes what a user sees.
"""
