#!/bin/bash
# The GPU checks of issue 4, in one go, on the H100 test machine (see docs/benchmarks.md).
# Usage (repo root, wheels from ../shared/device-wheels + pytest in .whl/):
#   OUT=/some/dir bash scripts/gpu_checks.sh [tests|grid|sessions|all]
# Writes: env.txt, pytest_gpu.txt, bench_grid.{txt,json,csv}, bench_sessions.{txt,json}.
set -o pipefail
what=${1:-all}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/daemon:$PWD/clients:$PWD
else
  export PYTHONPATH=$PWD/daemon:$PWD/clients:$PWD
fi
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c 'import sys, torch, numpy, onnxruntime; print(sys.version.split()[0], "torch",
torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
"numpy", numpy.__version__, "onnxruntime", onnxruntime.__version__)'
  python3 -m stgcnd doctor 2>&1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  timeout 300 python3 -m pytest -q -rs -p no:cacheprovider tests/backends tests/bench \
    -o addopts="" --durations=8 2>&1 | tee "$OUT/pytest_gpu.txt" || rc=1
fi
if [ "$what" = grid ] || [ "$what" = all ]; then
  timeout 420 python3 -m stgcnd --log-level warning bench --device cuda --persons 1 2 5 \
    --batch ${BATCHES:-1 8 64} --backends torch torch-cudagraph --precisions fp32 fp16 \
    --iterations ${ITER:-100} --warmup 10 --json "$OUT/bench_grid.json" \
    --csv "$OUT/bench_grid.csv" 2>"$OUT/bench_grid.err" | tee "$OUT/bench_grid.txt" || rc=1
fi
if [ "$what" = sessions ] || [ "$what" = all ]; then
  timeout 300 python3 -m stgcnd --log-level warning bench --device cuda --persons 1 \
    --batch 1 --backends torch-cudagraph torch --precisions fp16 fp32 --sessions 1 4 8 16 \
    --iterations ${ITER:-200} --warmup 20 --json "$OUT/bench_sessions.json" \
    2>"$OUT/bench_sessions.err" | tee "$OUT/bench_sessions.txt" || rc=1
fi
exit $rc
