"""Serve the OpenVINO classifier: ``python examples/openvino/server.py`` (Ctrl+C stops it).

HTTP on 127.0.0.1:8000, gRPC on 8001, metrics on 8002; ``PYSERVE_HTTP_PORT`` etc. override them (``0``: a free
port). ``serve()`` prints where it serves.
"""

from model import bind_classifier

from pyserve import Serve, ServeConfig


def main() -> None:
    with Serve(ServeConfig.from_env()) as server:
        bind_classifier(server)
        server.serve()


if __name__ == "__main__":
    main()
