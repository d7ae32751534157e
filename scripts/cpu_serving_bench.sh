#!/bin/bash
# The serving core on a CPU: the daemon's own overhead (noop backend), and the batched design
# against the previous per-camera design on the same machine, same model, same load.
# Usage (repo root, venv active): OUT=dir bash scripts/cpu_serving_bench.sh
# .old/ holds the previous design's daemon/ and clients/ (git archive 5fdd169 daemon clients).
set -o pipefail
OUT=${OUT:-/tmp/cpu-out}
DUR=${DUR:-10}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
NEW=$PWD/daemon:$PWD/clients
OLD=$PWD/.old/daemon:$PWD/.old/clients
tmp=$(mktemp -d)
lscpu | grep -E "Model name|^CPU\(s\)" | tee "$OUT/cpu.txt"
python -c "import sys, torch, onnxruntime; print('python', sys.version.split()[0], 'torch', torch.__version__, 'onnxruntime', onnxruntime.__version__)" | tee -a "$OUT/cpu.txt"

# 1. The daemon itself: noop backend (copies each window, returns zeros), T=150, M=1.
PYTHONPATH=$NEW python -m stgcnd loadtest --serve --backend noop --processes 2 --cameras 8 \
  --closed-loop --duration "$DUR" --json "$OUT/noop-16-closed.json" 2>&1 | tail -14 \
  | tee "$OUT/noop.txt"
PYTHONPATH=$NEW python -m stgcnd loadtest --serve --backend noop --processes 1 --cameras 1 \
  --closed-loop --duration "$DUR" --json "$OUT/noop-1-closed.json" 2>&1 | tail -14 \
  | tee -a "$OUT/noop.txt"

# 2. Old design vs new, torch CPU backend, T=30 demo model (keeps a window at ~10 ms here).
run() {  # $1 name, $2 PYTHONPATH, $3 extra model keys
  cat > "$tmp/$1.toml" <<TOML
[server]
endpoint = "ipc://$tmp/$1.sock"
engines_dir = "$tmp/engines-$1"
stats_interval = 2.0
[[models]]
name = "demo"
frames = 30
backend = "torch"
device = "cpu"
$3
TOML
  PYTHONPATH=$2 python -m stgcnd --log-format json serve --config "$tmp/$1.toml" \
    > "$OUT/daemon-$1.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 240); do grep -q '"event": "ready"' "$OUT/daemon-$1.log" && break; sleep 1; done
  for n in 1 8; do
    echo "== $1: $n cameras, closed loop" | tee -a "$OUT/designs.txt"
    PYTHONPATH=$NEW python -m stgcnd loadtest --endpoint "ipc://$tmp/$1.sock" --frames 30 \
      --processes 1 --cameras $n --closed-loop --duration "$DUR" \
      --json "$OUT/$1-$n-closed.json" 2>&1 | tail -12 | tee -a "$OUT/designs.txt"
  done
  kill -TERM $pid; wait $pid; echo "daemon $1 exit code $?" | tee -a "$OUT/designs.txt"
}
run new "$NEW" "demo = true"
run old "$OLD" "warm_sessions = 8"
