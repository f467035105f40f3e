#!/usr/bin/env bash
# Install Triton's perf_analyzer into DIR (default .tools/pa) and print the wrapper's path.
# The PyPI package `perf-analyzer` is an empty placeholder; the real binary ships inside the tritonclient 2.51.0
# manylinux wheel (later wheels need glibc 2.38 or carry none). It needs libb64.so.0d (Debian libb64-0d) and
# libcudart.so.12 (PyPI nvidia-cuda-runtime-cu12; no GPU is used). Nothing is installed system-wide.
set -euo pipefail
dir=${1:-.tools/pa}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [ -x "$dir/perf_analyzer" ] && "$dir/perf_analyzer" --version >/dev/null 2>&1; then
  echo "$dir/perf_analyzer"
  exit 0
fi
case "$(uname -sm)" in
  "Linux x86_64") ;;
  *) echo "perf_analyzer: only Linux x86_64 is supported by this installer" >&2; exit 1 ;;
esac
py=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m pip download -q --no-deps -d "$work" "tritonclient==2.51.0" "nvidia-cuda-runtime-cu12==12.*" >&2
"$py" -m zipfile -e "$work"/tritonclient-2.51.0-*manylinux*x86_64*.whl "$work/tritonclient" >&2
"$py" -m zipfile -e "$work"/nvidia_cuda_runtime_cu12-*.whl "$work/cudart" >&2
mkdir -p "$dir/lib"
install -m 755 "$work/tritonclient/tritonclient-2.51.0.data/data/bin/perf_analyzer" "$dir/perf_analyzer.bin"
cp -L "$work"/cudart/nvidia/cuda_runtime/lib/libcudart.so.12 "$dir/lib/"
(
  cd "$work"
  apt-get download libb64-0d >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get download libb64-0d >/dev/null; }
  dpkg -x libb64-0d_*.deb "$work/b64"
)
cp -L "$work"/b64/usr/lib/x86_64-linux-gnu/libb64.so.0d* "$dir/lib/"
cat > "$dir/perf_analyzer" <<WRAPPER
#!/usr/bin/env bash
LD_LIBRARY_PATH="$dir/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$dir/perf_analyzer.bin" "\$@"
WRAPPER
chmod +x "$dir/perf_analyzer"
"$dir/perf_analyzer" --version >&2
echo "$dir/perf_analyzer"
