#!/usr/bin/env bash
# The one prepared GPU check (issue 8). On the H200: `bench/gpu/run_gpu_check.sh` (about 3-6 minutes).
# Anywhere: `bench/gpu/run_gpu_check.sh --dry-run` runs every code path on the CPU under the interpreter.
# Uses $PYTHON, else the project venv, else python3 (the GPU machine's own torch + triton). Results go to
# bench/results/gpu.json (gpu_dryrun.json for --dry-run) and are copied into $OUT when that is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
case " $* " in
  *" --dry-run "*) ;;
  *) command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv ;;
esac
# A script path (not -m) so the repository root, whose operator/ folder would shadow the stdlib, is not on sys.path.
"$PY" bench/gpu/gpu_check.py "$@"
rc=$?
if [ -n "${OUT:-}" ] && [ -d "${OUT}" ]; then cp bench/results/gpu*.json "$OUT"/ 2>/dev/null; fi
exit $rc
