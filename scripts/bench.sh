#!/usr/bin/env bash
# The benchmark suite (scripts/bench.py): throughput, hf vs vLLM, seconds per phase, memory for
# 1/2/4 agents, learning at equal wall time (GAE and group advantages). --quick: a few minutes; the
# full mode about four and a half hours (8 learning configurations × 3 seeds × 10 min).
# Writes results/bench.{json,md} and figures; --update_page rewrites docs/benchmark.md's results block.
set -euo pipefail
# The hf-vs-vLLM section needs vLLM: install it unless MARFT_VLLM=0 (the section then records why it skipped).
export MARFT_VLLM="${MARFT_VLLM:-1}"
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
exec python scripts/bench.py "$@"
