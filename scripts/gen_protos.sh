#!/usr/bin/env bash
# Regenerate the protobuf / gRPC stubs of pyserve/frontends/protocol from its .proto files (needs grpcio-tools,
# installed by the test extras). The stubs are committed; tests/unit/test_protos.py checks they match.
#   bash scripts/gen_protos.sh            # rewrite the committed stubs
#   bash scripts/gen_protos.sh OUT_DIR    # write them under OUT_DIR instead (same relative paths)
# The messages are registered in pyserve's own descriptor pool and its own symbol database, not protobuf's default
# ones: Triton's client registers the same 'inference.*' names there, and both must load in one process (under
# protobuf's pure-Python implementation too).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
out=${1:-.}
protos=pyserve/frontends/protocol
mkdir -p "$out"
"$python" -m grpc_tools.protoc -I . --python_out="$out" --pyi_out="$out" "$protos/model_config.proto"
"$python" -m grpc_tools.protoc -I . --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "$protos/grpc_service.proto" "$protos/health.proto"
"$python" - "$out/$protos" <<'PY'
import pathlib
import sys

folder = pathlib.Path(sys.argv[1])
header = "# ruff: noqa\n# mypy: ignore-errors\n"
for path in sorted(folder.glob("*_pb2*.py*")):
    text = path.read_text()
    if path.name.endswith("_pb2.py"):
        text = text.replace(
            "# @@protoc_insertion_point(imports)\n",
            "# @@protoc_insertion_point(imports)\n"
            "from pyserve.frontends.protocol import POOL as _POOL, build_messages as _build_messages\n",
            1,
        )
        text = text.replace("_descriptor_pool.Default().AddSerializedFile(", "_POOL.AddSerializedFile(", 1)
        text = text.replace("_builder.BuildTopDescriptorsAndMessages(", "_build_messages(", 1)
        if "_POOL.AddSerializedFile(" not in text or "_build_messages(" not in text:
            sys.exit(f"{path}: unexpected protoc output; cannot point it at pyserve's descriptor pool")
    path.write_text(header + text)
PY
