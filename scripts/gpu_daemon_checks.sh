#!/bin/bash
# The daemon on a GPU: its tests with CUDA sessions, then simulated cameras against it.
# Usage (repo root, wheels in .whl/ as for scripts/gpu_checks.sh): OUT=dir bash scripts/gpu_daemon_checks.sh
set -o pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/daemon:$PWD/clients:$PWD
rc=0
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 240 python3 -m pytest -q -rfs -p no:cacheprovider tests/backends -o addopts="" \
    > "$OUT/pytest_backends.txt" 2>&1 || rc=1
  tail -3 "$OUT/pytest_backends.txt"
  timeout 300 python3 -m pytest -q -rfs -p no:cacheprovider tests/server -o addopts="" \
    --durations=5 > "$OUT/pytest_server.txt" 2>&1 || rc=1
  tail -3 "$OUT/pytest_server.txt"
fi
# End to end: daemon (torch, CUDA, fp16, CUDA graphs) + simulated cameras through the client.
tmp=$(mktemp -d)
cat > "$tmp/gpu.toml" <<TOML
[server]
endpoint = "ipc://$tmp/d.sock"
engines_dir = "$tmp/engines"
stats_interval = 5.0
queue_size = 16
[[models]]
name = "single"
demo = true
backend = "torch"
device = "cuda"
precision = "fp16"
cuda_graph = true
warm_sessions = ${WARM:-4}
TOML
python3 -m stgcnd --log-format json serve --config "$tmp/gpu.toml" > "$OUT/daemon.log" 2>&1 &
pid=$!
for i in $(seq 1 120); do grep -q '"event": "ready"' "$OUT/daemon.log" && break; sleep 1; done
for n in 1 8 16; do
  echo "== push, stride 1, $n cameras at 25 fps" | tee -a "$OUT/sim.txt"
  timeout 60 python3 -m stgcnd camera-sim --endpoint "ipc://$tmp/d.sock" --cameras $n \
    --mode push --duration 15 2>&1 | tail -$((n + 3)) | tee -a "$OUT/sim.txt"
  echo "== window, $n cameras at 25 fps" | tee -a "$OUT/sim.txt"
  timeout 60 python3 -m stgcnd camera-sim --endpoint "ipc://$tmp/d.sock" --cameras $n \
    --mode window --duration 10 2>&1 | tail -$((n + 3)) | tee -a "$OUT/sim.txt"
done
kill -TERM $pid; wait $pid; echo "daemon exit code $?" | tee -a "$OUT/sim.txt"
python3 -m stgcnd logs summarize "$OUT/daemon.log" > "$OUT/summary.txt" 2>&1
head -40 "$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/sim.txt"
exit $rc
