#!/usr/bin/env bash
# MARFT on code: programs graded by unit tests in a sandbox (envs/code_env.py, envs/sandbox.py).
# train_math.sh with code defaults: the same environment variables (MODEL, DATA, EVAL_DATA, AGENTS,
# ITERATIONS, BATCH_SIZE, LR, SEED, NPROC, BACKEND, …), and any marft.py option can be appended:
#   AGENTS=coder_reviewer bash scripts/train_code.sh --horizon 2
set -euo pipefail
export DATA="${DATA:-code}"          # code (generated), humaneval, or an MBPP-format .jsonl
export AGENTS="${AGENTS:-coder}"     # coder | planner_coder | coder_reviewer | profile.json
export ITERATIONS="${ITERATIONS:-10}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/train_math.sh" --max_new_tokens "${MAX_NEW_TOKENS:-48}" "$@"
