"""The Flask app with its model call swapped for pyserve's in-process API.

    python examples/from_flask/flask_inprocess_app.py [--port 5000]

Same routes, same JSON, same clients as ``flask_app.py``. The one change is the line that runs the model: instead of
``predict(features)`` on this request's row, the view calls ``server.infer("classifier", ...)``, the in-process API
of a ``Serve`` started in this same process. Flask's threads call it concurrently, and pyserve's core batches the rows
that arrive together into one call of ``classify`` (``pyserve_app.py``'s model, bound here as it is there).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType

from flask import Flask, Response, jsonify, request
from model import parse_features
from pyserve_app import MODEL_NAME, bind

from pyserve import Serve, ServeConfig


def create_app(server: Serve) -> Flask:
    """``flask_app.py``'s app, its model call going to ``server``."""
    app = Flask(__name__)

    @app.route("/predict", methods=["POST"])
    def predict_route() -> Response | tuple[Response, int]:
        """Parse the JSON features as before; the model runs batched with the other threads' requests."""
        try:
            features = parse_features(request.get_json(force=True, silent=True))
        except ValueError as exc:
            return jsonify(error=str(exc)), 400
        outputs = server.infer(MODEL_NAME, {"features": features})  # was: labels, scores = predict(features)
        return jsonify(label=outputs["label"][0, 0].decode(), score=float(outputs["score"][0, 0]))

    @app.route("/health")
    def health() -> str:
        """Liveness probe."""
        return "ok"

    return app


def _exit(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)  # unwinds through `with server:`, which stops the core and removes its shared memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument(
        "--pyserve-port", type=int, default=0, help="pyserve's own HTTP port, for its statistics (default: any)"
    )
    parser.add_argument("--access-log", action="store_true", help="log every request (off: it costs time per request)")
    args = parser.parse_args()
    if not args.access_log:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _exit)
    with Serve(ServeConfig.from_env(http_port=args.pyserve_port, grpc_port=0, metrics_port=0)) as server:
        bind(server)
        server.run()
        create_app(server).run(host=args.host, port=args.port, threaded=True)


if __name__ == "__main__":
    main()
