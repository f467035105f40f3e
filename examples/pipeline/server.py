"""Serve the sentiment pipeline on the default ports: ``python examples/pipeline/server.py`` (Ctrl+C stops it).

Models ``tokenize``, ``score`` and ``label``, and the ensemble ``sentiment`` that runs them in order inside the
server: HTTP on 127.0.0.1:8000, gRPC on 8001 (``PYSERVE_HTTP_PORT`` etc. override them).
"""

from models import bind_pipeline

from pyserve import Serve, ServeConfig


def main() -> None:
    with Serve(ServeConfig.from_env()) as server:
        bind_pipeline(server)
        print(f"serving the ensemble 'sentiment' on {server.url} (gRPC port {server.grpc_port})", flush=True)
        server.serve()


if __name__ == "__main__":
    main()
