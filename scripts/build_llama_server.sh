#!/usr/bin/env bash
# Build llama.cpp's llama-server (the benchmark peer) from the sources vendored in the
# llama-cpp-python sdist, into .tools/llama.cpp/, and convert the embedded GGUF to BF16,
# F32 and Q8_0 with llama-quantize. Idempotent: each step is skipped when its output exists.
#
#   scripts/build_llama_server.sh            # build + convert
#   JOBS=1 nice -n 19 scripts/build_llama_server.sh   # gentler on a shared machine
#
# Takes about 13 minutes on 2 cores. Only PyPI is reached (pip download of the sdist).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
TOOLS="$ROOT/.tools/llama.cpp"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS="${JOBS:-$(nproc)}"
BIN="$TOOLS/bin"
mkdir -p "$TOOLS" "$BIN"

# 1. the sdist (carries llama.cpp under vendor/llama.cpp)
SDIST="$TOOLS/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$TOOLS"
fi
SRC="$TOOLS/src"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  rm -rf "$SRC" "$TOOLS/llama_cpp_python-$VERSION"
  tar -xzf "$SDIST" -C "$TOOLS"
  mv "$TOOLS/llama_cpp_python-$VERSION/vendor/llama.cpp" "$SRC"
  rm -rf "$TOOLS/llama_cpp_python-$VERSION"
fi

# 2. build llama-server and llama-quantize only. LLAMA_USE_PREBUILT_UI=OFF: otherwise
# the build downloads the web UI; curl off: no model download support needed.
if [ ! -x "$BIN/llama-server" ] || [ ! -x "$BIN/llama-quantize" ]; then
  cmake -S "$SRC" -B "$TOOLS/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF
  cmake --build "$TOOLS/build" -j "$JOBS" --target llama-server llama-quantize
  cp "$TOOLS/build/bin/llama-server" "$TOOLS/build/bin/llama-quantize" "$BIN/"
fi

# 3. BF16 and F32 copies of the embedded model (dequantised: the same weights we serve), and Q8_0
# (requantised from the same embedded weights: llama.cpp's 8-bit format, the peer of our int8)
GGUF="$("$PY" -c 'from kvloop.engine.model.locate import embedded_model_path as e; print(e())')"
for T in BF16 F32 Q8_0; do
  OUT="$TOOLS/model-$(echo "$T" | tr 'A-Z' 'a-z').gguf"
  if [ ! -f "$OUT" ]; then
    "$BIN/llama-quantize" --allow-requantize "$GGUF" "$OUT.tmp" "$T"
    mv "$OUT.tmp" "$OUT"
  fi
done
echo "llama-server: $BIN/llama-server"
ls -la "$TOOLS"/model-*.gguf
