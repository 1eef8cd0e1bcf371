#!/usr/bin/env bash
# Evaluate the base model or a checkpoint of a run (evaluate.py; every option can be appended):
#   bash scripts/eval_math.sh                                                 # base model, chain, generated held-out task
#   bash scripts/eval_math.sh --run runs/<name> --checkpoint iter_000006      # a checkpoint (default: the latest)
#   bash scripts/eval_math.sh --data ../shared/data/math_test.jsonl --limit 200 --samples 4 --agents chain3
#   bash scripts/eval_math.sh --run runs/<name> --backend vllm                  # vLLM generation (installed on first use)
set -euo pipefail
case " $* " in *" --backend vllm "* | *" --backend=vllm "*) export MARFT_VLLM=1 ;; esac
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
exec python evaluate.py "$@"
