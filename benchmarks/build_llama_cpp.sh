#!/usr/bin/env bash
# Build llama.cpp's llama-batched-bench from the sources vendored in the llama-cpp-python sdist (PyPI),
# for benchmarks/cpu_path.py's llama.cpp peer. Never run by tests or CI. Nothing here is committed:
# sources and binary live under $LLAMA_CPP_DIR (default /tmp/prefixflow-llama-cpp).
# Usage: bash benchmarks/build_llama_cpp.sh [version]   -> prints the binary's path on its last line
# LLAMA_CPP_JOBS (default 2): parallel compile jobs; LLAMA_CPP_SDIST: an sdist already downloaded.
set -euo pipefail
VERSION="${1:-0.3.36}"
DIR="${LLAMA_CPP_DIR:-/tmp/prefixflow-llama-cpp}"
BIN="$DIR/build/bin/llama-batched-bench"
mkdir -p "$DIR"
if [[ ! -x "$BIN" ]]; then
  cd "$DIR"
  if [[ -n "${LLAMA_CPP_SDIST:-}" && ! -f "llama_cpp_python-$VERSION.tar.gz" ]]; then
    cp "$LLAMA_CPP_SDIST" "llama_cpp_python-$VERSION.tar.gz"
  fi
  if [[ ! -f "llama_cpp_python-$VERSION.tar.gz" ]]; then
    pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d . >&2
  fi
  [[ -d "llama_cpp_python-$VERSION" ]] || tar xzf "llama_cpp_python-$VERSION.tar.gz"
  SRC="$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
  # CPU only, native ISA (what llama.cpp users build), no curl/server extras; nice: the host is shared
  nice -n 19 cmake -S "$SRC" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF >&2
  nice -n 19 cmake --build "$DIR/build" --target llama-batched-bench -j "${LLAMA_CPP_JOBS:-2}" >&2
fi
echo "$BIN"
