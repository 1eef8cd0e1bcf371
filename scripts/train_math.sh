#!/usr/bin/env bash
# The main job: MARFT on the math task. Every default can be overridden by an environment
# variable below, and any other marft.py option can be appended: bash scripts/train_math.sh --lam 0.9
set -euo pipefail
NPROC="${NPROC:-1}"                  # processes (ranks) on this node: G > 1 launches torchrun (data parallel)
case "$NPROC" in
  '' | *[!0-9]* | 0) echo "NPROC=$NPROC: give the number of processes on this node, a whole number ≥ 1 (e.g. NPROC=2)" >&2; exit 2 ;;
esac
BACKEND_SET="${BACKEND:+1}"
BACKEND="${BACKEND:-hf}"             # hf (transformers + peft) | vllm (installed on first use)
if [ "$BACKEND" = "vllm" ]; then export MARFT_VLLM=1; fi
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

MODEL="${MODEL:-smollm2}"            # smollm2 (embedded), a local HF folder, or a hub id
DATA="${DATA:-arithmetic}"           # arithmetic or code (generated), humaneval, a MATH/GSM8K/MBPP .jsonl, or an HF dataset id
EVAL_DATA="${EVAL_DATA:-}"           # held-out file (default: the arithmetic or code test split / tail of DATA)
AGENTS="${AGENTS:-}"                 # the task's default (math: chain) | single | chain3 | chain4 | parallel | orchestrated | … | profile.json
LEVEL="${LEVEL:-action}"             # --decision_unit: action | token (one PPO decision per response, or per token)
ITERATIONS="${ITERATIONS:-10}"
BATCH_SIZE="${BATCH_SIZE:-16}"       # problems per iteration
LR="${LR:-2e-4}"
SEED="${SEED:-1}"
OUTPUT_DIR="${OUTPUT_DIR:-runs}"
# The job is sized to stay within 10 minutes on 2 cores of the slowest VM it ran on (an AMD EPYC,
# 8.7–9.4 min; 12 iterations took 10.0–10.8 there). The held-out evaluation changes nothing the agents learn
# (every iteration is seeded from (seed, k)): one sample per problem for pass@1, and a greedy
# evaluation at the start, halfway and at the end.
EVAL_SAMPLES="${EVAL_SAMPLES:-1}"
EVAL_INTERVAL="${EVAL_INTERVAL:-5}"

LAUNCH=(python)
if [ "$NPROC" -gt 1 ]; then
  LAUNCH=(torchrun --standalone --nproc-per-node "$NPROC")
fi
# --resume: the run's own config.json holds every option; only what the command line gives is passed
# (and BACKEND when set: the backend may change on resume)
for arg in "$@"; do
  case "$arg" in
    --resume | --resume=*) exec "${LAUNCH[@]}" marft.py ${BACKEND_SET:+--backend "$BACKEND"} "$@" ;;
  esac
done
ORGANISATION=()
if [ -n "$AGENTS" ]; then ORGANISATION=(--agents "$AGENTS"); fi
exec "${LAUNCH[@]}" marft.py \
  --model "$MODEL" --data "$DATA" --eval_data "$EVAL_DATA" "${ORGANISATION[@]}" --decision_unit "$LEVEL" --backend "$BACKEND" \
  --iterations "$ITERATIONS" --batch_size "$BATCH_SIZE" --lr "$LR" --seed "$SEED" \
  --eval_samples "$EVAL_SAMPLES" --eval_interval "$EVAL_INTERVAL" \
  --output_dir "$OUTPUT_DIR" "$@"
