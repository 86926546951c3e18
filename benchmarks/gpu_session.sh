#!/usr/bin/env bash
# One device call: GPU correctness tests at real sizes, then the benchmark suites given as args.
# Usage (repo root, on the GPU machine): bash benchmarks/gpu_session.sh OUTDIR [suite ...]
set -u -o pipefail
out=${1:?output folder}; shift
export PYTHONUNBUFFERED=1
mkdir -p "$out/results"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
if [ -z "${SKIP_TESTS:-}" ]; then
  FLASHLIB_AUTOTUNE=0 timeout ${TEST_TIMEOUT:-540} python3 -m pytest -p no:cacheprovider -o addopts="" -v -rs --durations=0 \
    ${TESTS:-tests/test_flash_attention.py} > "$out/tests.log" 2>&1; tail -45 "$out/tests.log"
fi
if [ $# -gt 0 ]; then
  python3 -m flashlib.bench --suite "$@" --out "$out/results" 2>&1 | tee "$out/bench.log" | grep -v '%|'
fi
