#!/usr/bin/env bash
# The one test command (README; .ci/run calls exactly this): make a venv, install pyserve with its test extras,
# perf_analyzer and PyTriton (for its client, in a venv of its own), lint, then run the test suite. Extra arguments go to pytest (default: everything but slow/gpu).
#   bash scripts/test.sh              # default suite
#   bash scripts/test.sh -m slow      # soak/stress tests
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[dev]"
mkdir -p .tools
# The status page's browser test drives Debian's Chromium (tests/integration/test_dashboard.py; skipped without it).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "chromium could not be installed: the status page's browser test will be skipped" >&2
fi
if PERF_ANALYZER=$(PYTHON=.venv/bin/python bash scripts/install-perf-analyzer.sh .tools/pa 2>.tools/pa-install.log); then
  export PERF_ANALYZER
elif [ "${PYSERVE_ALLOW_NO_PERF_ANALYZER:-}" = 1 ]; then
  echo "perf_analyzer could not be installed (PYSERVE_ALLOW_NO_PERF_ANALYZER=1): its tests will be skipped" >&2
else
  # Its tests would skip silently: fail instead, with the installer's reason.
  echo "perf_analyzer could not be installed; the installer said:" >&2
  cat .tools/pa-install.log >&2
  echo "(on a platform without it, PYSERVE_ALLOW_NO_PERF_ANALYZER=1 runs the tests without perf_analyzer)" >&2
  exit 1
fi
# PyTriton's own client against pyserve (tests/integration/test_pytriton_compat.py; the slow PyTriton tests too)
# runs from benchmarks/.pytriton-venv: nvidia-pytriton, made once (~20 s).
make_pytriton_venv='import sys; sys.path.insert(0, "benchmarks"); from _common import ensure_pytriton_venv as e; e()'
if ! .venv/bin/python -c "$make_pytriton_venv" >.tools/pytriton-install.log 2>&1; then
  if [ "${PYSERVE_ALLOW_NO_PYTRITON:-}" = 1 ]; then
    echo "PyTriton could not be installed (PYSERVE_ALLOW_NO_PYTRITON=1): its tests will be skipped" >&2
  else
    echo "PyTriton (benchmarks/.pytriton-venv) could not be installed:" >&2
    tail -n 40 .tools/pytriton-install.log >&2
    echo "(on a platform without it, PYSERVE_ALLOW_NO_PYTRITON=1 runs the tests without PyTriton)" >&2
    exit 1
  fi
fi
.venv/bin/ruff check pyserve tests benchmarks examples
.venv/bin/mypy
if [ $# -eq 0 ]; then
  set -- -m "not slow and not gpu"
fi
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
