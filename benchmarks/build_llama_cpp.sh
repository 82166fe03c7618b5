#!/usr/bin/env bash
# Build llama.cpp's llama-batched-bench from the sources vendored in the llama-cpp-python sdist (PyPI),
# for benchmarks/cpu_path.py's llama.cpp peer. Never run by tests or CI. Nothing here is committed:
# sources and binary live under $LLAMA_CPP_DIR (default /tmp/prefixflow-llama-cpp).
# Usage: bash benchmarks/build_llama_cpp.sh [version]   -> prints the binary's path on its last line
# LLAMA_CPP_JOBS (default 2): parallel compile jobs; LLAMA_CPP_SDIST: an sdist already downloaded;
# LLAMA_CPP_ISA=avx2: an AVX2/FMA/F16C build without AVX-512 (into build-avx2), what an AVX2 host's
# native build runs, to measure that host's peer on an AVX-512 CPU (benchmarks/cpu_path.py docstring).
set -euo pipefail
VERSION="${1:-0.3.36}"
DIR="${LLAMA_CPP_DIR:-/tmp/prefixflow-llama-cpp}"
ISA="${LLAMA_CPP_ISA:-native}"
BUILD="$DIR/build"
ISA_FLAGS=(-DGGML_NATIVE=ON)
if [[ "$ISA" == "avx2" ]]; then
  BUILD="$DIR/build-avx2"
  ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
    -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF)
fi
BIN="$BUILD/bin/llama-batched-bench"
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
  nice -n 19 cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${ISA_FLAGS[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF >&2
  nice -n 19 cmake --build "$BUILD" --target llama-batched-bench -j "${LLAMA_CPP_JOBS:-2}" >&2
fi
echo "$BIN"
