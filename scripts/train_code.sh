#!/usr/bin/env bash
# MARFT on code: programs graded by unit tests in a sandbox (envs/code_env.py, envs/sandbox.py).
# train_math.sh with code defaults: the same environment variables (MODEL, DATA, EVAL_DATA, AGENTS,
# ITERATIONS, BATCH_SIZE, LR, SEED, NPROC, BACKEND, …), and any marft.py option can be appended
# (the last value of an option wins):
#   AGENTS=coder_reviewer bash scripts/train_code.sh --horizon 2
#   bash scripts/train_code.sh --advantage gae --group_size 1 --batch_size 16   # critic + GAE instead
set -euo pipefail
export DATA="${DATA:-code}"          # code (generated), humaneval, or an MBPP-format .jsonl
export AGENTS="${AGENTS:-coder}"     # coder | planner_coder | coder_reviewer | profile.json
export ITERATIONS="${ITERATIONS:-20}"
export BATCH_SIZE="${BATCH_SIZE:-4}" # problems per iteration, each played GROUP_SIZE times
GROUP_SIZE="${GROUP_SIZE:-4}"        # group advantages: each episode against the others of its problem
exec bash "$(dirname "${BASH_SOURCE[0]}")/train_math.sh" --max_new_tokens "${MAX_NEW_TOKENS:-48}" \
  --advantage group --group_size "$GROUP_SIZE" --credit shared --eval_samples 4 "$@"
