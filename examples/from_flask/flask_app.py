"""The classic Flask app: ``python examples/from_flask/flask_app.py [--port 5000]``.

``POST /predict`` with ``{"features": [256 numbers]}`` answers ``{"label": "airplane", "score": 0.197}``.
Served by Flask's built-in threaded server (one thread per connection).
"""

from __future__ import annotations

import argparse
import logging

from flask import Flask, Response, jsonify, request
from model import parse_features, predict

app = Flask(__name__)


@app.route("/predict", methods=["POST"])
def predict_route() -> Response | tuple[Response, int]:
    """Parse the JSON features, run pre-processing, the model and post-processing for this one request."""
    try:
        features = parse_features(request.get_json(force=True, silent=True))
    except ValueError as exc:
        return jsonify(error=str(exc)), 400
    labels, scores = predict(features)
    return jsonify(label=labels[0], score=float(scores[0]))


@app.route("/health")
def health() -> str:
    """Liveness probe."""
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--access-log", action="store_true", help="log every request (off: it costs time per request)")
    args = parser.parse_args()
    if not args.access_log:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app.run(host=args.host, port=args.port, threaded=True)


if __name__ == "__main__":
    main()
