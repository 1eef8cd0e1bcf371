#!/usr/bin/env bash
# What anyone with a GPU runs first: the GPU tests; each model's decoding step against its
# memory-bandwidth floor; the default job with a bf16 base sampled by vLLM where it is installed (the
# rollout correction's rollout/* metrics); then two iterations of the default job on cuda with random-weight
# models shaped like SmolLM2-135M and Qwen2.5-1.5B; writes results/gpu.json.
# Needs a CUDA build of torch with transformers and peft already installed; installs nothing from
# the network. PYTHON=… picks the interpreter (default: python3); WHEELS=dir installs the small
# pure-Python packages it lacks (math-verify, latex2sympy2_extended, antlr4-python3-runtime) from a
# folder of wheels into a temporary folder, not into that Python. Options: scripts/gpu_check.py --help.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
if [ -n "${WHEELS:-}" ]; then
  SITE="$(mktemp -d "${TMPDIR:-/tmp}/marft-wheels.XXXXXX")"
  "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
cd "$ROOT"
exec "$PYTHON" scripts/gpu_check.py "$@"
