#!/usr/bin/env bash
# The test command (CI runs this). FAST=1 skips the tests marked slow.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
MARKERS=()
if [ "${FAST:-0}" = "1" ]; then MARKERS=(-m "not slow"); fi
exec python -m pytest tests -ra "${MARKERS[@]}" "$@"
