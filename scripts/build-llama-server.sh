#!/usr/bin/env bash
# Build llama.cpp's llama-server (and llama-bench) from the llama.cpp that the
# llama-cpp-python sdist vendors, the same version spectune's llama.cpp runtime uses:
#
#   scripts/build-llama-server.sh [OUT_DIR]     (default build/llama.cpp)
#
# The sdist comes from the package index pip is configured with (no network beyond it);
# SDIST=path/to/llama_cpp_python-0.3.36.tar.gz uses a file already here. Two cores take
# 10-20 minutes. The binaries land in OUT_DIR/cmake/bin; `spectune tune --engine llamacpp
# --server-binary OUT_DIR/cmake/bin/llama-server` and the llama.cpp tests (LLAMA_SERVER) use them.
set -euo pipefail
VERSION=0.3.36
OUT=$(realpath -m "${1:-build/llama.cpp}")
mkdir -p "$OUT"
SRC="$OUT/src"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    SDIST=${SDIST:-}
    if [ -z "$SDIST" ]; then
        python -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$OUT/sdist"
        SDIST=$(ls "$OUT"/sdist/llama_cpp_python-"$VERSION".tar.gz)
    fi
    tmp=$(mktemp -d)
    tar xzf "$SDIST" -C "$tmp"
    rm -rf "$SRC"
    mv "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp" "$SRC"
    rm -rf "$tmp"
fi
cmake -S "$SRC" -B "$OUT/cmake" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON

cmake --build "$OUT/cmake" --target llama-server llama-bench -j "$(nproc)"
echo "$OUT/cmake/bin/llama-server"
