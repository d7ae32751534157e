#!/usr/bin/env bash
# The GPU checks and the serving figures of docs/performance.md, on a CUDA machine.
#
#   OUT=dir bash scripts/device_check.sh tests    # GPU tests, bench, the ZeroMQ floor
#   OUT=dir bash scripts/device_check.sh floor    # bench and the ZeroMQ floor alone
#   OUT=dir bash scripts/device_check.sh serve [TREE]  # the loadtest scenarios (SCENARIOS,
#                                                 # default all) against this tree's daemon,
#                                                 # or TREE's (a checkout of another commit);
#                                                 # MODEL=noop serves the noop backend
#   OUT=dir bash scripts/device_check.sh memory [OLD]  # M=1 + M=5, torch fp16, a 6 GB
#                                                 # budget: READY, nvidia-smi, 32 + 32 cameras
#   OUT=dir bash scripts/device_check.sh compile  # torch.compile: its tests, the bench against
#                                                 # today's graphs and a user's torch.compile,
#                                                 # first and second start, saturation;
#                                                 # COMPILE=max-autotune BUCKETS="[1, 64]"
#                                                 # serves autotuned kernels (their trial in
#                                                 # the first start); SAT_CAMERAS="24 32"
#                                                 # adds closed loops of 8 x K cameras
#   OUT=dir bash scripts/device_check.sh tune     # #45: compile auto, default buckets: READY
#                                                 # cold, 64 cameras at 25 Hz in 90 s chunks
#                                                 # while the buckets are tuned in the
#                                                 # background, until two chunks after the swap
#                                                 # (or TUNE_S, 1200), READY warm, then the
#                                                 # bench (M=1, batch 64): ours tuned and a
#                                                 # user's static max-autotune (DEFAULT_ROW=1:
#                                                 # ours default too; model_upgraded has both
#                                                 # inside the daemon; NO_BENCH=1: none). BUCKETS, CHUNK_S,
#                                                 # TUNE_PROCESSES x TUNE_CAMERAS: a smaller run
#                                                 # (TUNE_PROCESSES=0: no cameras, the trials
#                                                 # alone: the tuned second start and the bench;
#                                                 # TUNE_DELAY_US: the model's max_queue_delay_us);
#                                                 # COLD_DEFAULT_FIRST=1: READY cold with the
#                                                 # default buckets first, alone (COLD_TREE:
#                                                 # a folder of the tree holding another
#                                                 # checkout, whose daemon that start runs).
#                                                 # Longer than one device call: start it with
#                                                 # setsid; $OUT/done marks its end
#   OUT=dir bash scripts/device_check.sh peers    # #35: ours (torch fp16, compile auto in our
#                                                 # graphs) against a user's static torch.compile
#                                                 # (PEERS, default: mode default and
#                                                 # max-autotune), PERSONS "1 5" x BATCHES "1 64",
#                                                 # within PEERS_S (450) seconds; a second call on
#                                                 # the same machine compiles from its caches
#
# Wheels in .whl/ (if any) are installed to /tmp/site first (a machine without an index).
# Every daemon runs the demo model on torch fp16 with CUDA graphs; every load comes from this
# tree's `stgcnd loadtest`, so old and new are measured by the same client.
set -uo pipefail
PART=${1:-tests}
OLD=${2:-}
TAG=$PART${OLD:+-old}
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
RAW=$(mktemp -d)  # every log and JSON; $OUT gets summary.txt and raw.tgz of these
trap 'tar czf "$OUT/raw-$TAG.tgz" -C "$RAW" .' EXIT
HERE=$PWD
if [ -d .whl ]; then
  [ -f /tmp/site/.installed ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.installed || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
NEW_PATH=$HERE/daemon:$HERE/clients:$HERE/tools:$HERE:${PYTHONPATH:-}
TMP=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/summary-$TAG.txt"
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)' \
  | tee -a "$OUT/summary-$TAG.txt"

config() {  # $1 name, $2 models; writes $TMP/$1.toml
  cat >"$TMP/$1.toml" <<EOF
[server]
endpoint = "ipc://$TMP/$1.sock"
engines_dir = "$TMP/engines-$1"
stats_interval = 5.0
max_cameras = 200
$3
$2
EOF
}
MODEL_M1='[[models]]
name = "single"
demo = true
backend = "torch"
device = "cuda"
precision = "fp16"
labels = ["normal", "shoplifting"]'
MODEL_M5='[[models]]
name = "group"
demo = true
persons = 5
backend = "torch"
device = "cuda"
precision = "fp16"
labels = ["normal", "shoplifting"]'

start() {  # $1 name, $2 PYTHONPATH, $3 seconds to wait (120); sets DPID, waits for READY
  # (a new one: a second start of $1 appends to the same log)
  local before; before=$(cat "$RAW/daemon-$1.log" 2>/dev/null | grep -c '"event": "ready"')
  PYTHONPATH=$2 python3 -m stgcnd --log-format json serve --config "$TMP/$1.toml" \
    >>"$RAW/daemon-$1.log" 2>&1 &
  DPID=$!
  for _ in $(seq 1 $(( ${3:-120} * 2 ))); do
    [ "$(grep -c '"event": "ready"' "$RAW/daemon-$1.log")" -gt "$before" ] && return 0
    kill -0 $DPID 2>/dev/null || break
    sleep 0.5
  done
  echo "daemon $1 did not start"; tail -5 "$RAW/daemon-$1.log"; return 1
}
stop() {
  kill -TERM $DPID; wait $DPID; echo "daemon exit code $?" | tee -a "$OUT/summary-$TAG.txt"
}
lt() {  # $1 name, $2 scenario, rest: extra loadtest args
  local name=$1 scenario=$2; shift 2
  echo "== $name $scenario" | tee -a "$OUT/summary-$TAG.txt"
  PYTHONPATH=$NEW_PATH timeout 150 python3 -m stgcnd loadtest --endpoint "ipc://$TMP/$name.sock" \
    --scenario "$scenario" --json "$RAW/lt-$name-$scenario.json" "$@" 2>&1 | tail -20 \
    | tee -a "$OUT/summary-$TAG.txt"
}

if [ "$PART" = tests ]; then
  PYTHONPATH=$NEW_PATH timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/runtimes tests/server/test_serving_loop.py 2>&1 | tail -15 | tee -a "$OUT/summary-$TAG.txt"
fi
if [ "$PART" = tests ] || [ "$PART" = floor ]; then
  # The backend's best rate (saturation is judged against it) and the bare ZeroMQ floor.
  PYTHONPATH=$NEW_PATH timeout 150 python3 -m stgcnd bench --device cuda \
    --backends torch-cudagraph --precisions fp16 --batch 1 64 --persons 1 --iterations 30 \
    --json "$RAW/bench.json" 2>&1 | grep -v '^{' | tail -8 | tee -a "$OUT/summary-$TAG.txt"
  PYTHONPATH=$NEW_PATH python3 scripts/zmq_echo_floor.py 20000 | tee -a "$OUT/summary-$TAG.txt"
  PYTHONPATH=$NEW_PATH python3 scripts/zmq_echo_floor.py 250 --hold-us 0 --rate 25 \
    | tee -a "$OUT/summary-$TAG.txt"
fi

bench() {  # rest: bench args; the table's rows to the summary
  PYTHONPATH=$NEW_PATH timeout "$BENCH_S" python3 -m stgcnd bench --device cuda --precisions fp16 \
    --iterations 30 --store "$TMP/bench-store" --json "$RAW/bench-$PART.json" "$@" \
    >"$RAW/bench-$PART.txt" 2>&1
  grep -v '^{' "$RAW/bench-$PART.txt" | grep -A40 '^backend' | tee -a "$OUT/summary-$TAG.txt"
}

if [ "$PART" = compile ]; then
  config first "$MODEL_M1
compile = \"${COMPILE:-auto}\"${BUCKETS:+
max_batch = 64
buckets = $BUCKETS}" ""
  for run in ${STARTS:-cold warm}; do  # an empty store, then the same store again
    cp "$TMP/first.toml" "$TMP/$run.toml"
    t0=$(date +%s.%N)
    start $run "$NEW_PATH" ${START_S:-400} || break
    echo "READY $run: $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s," \
      "$(grep -c '"torch_compiled"' "$RAW/daemon-$run.log") buckets compiled" \
      | tee -a "$OUT/summary-$TAG.txt"
    grep '"torch_autotune_bucket"' "$RAW/daemon-$run.log" | cut -c1-400 \
      | tee -a "$OUT/summary-$TAG.txt"
    grep '"torch_compile_\(failed\|unavailable\)"' "$RAW/daemon-$run.log" | head -3 \
      | tee -a "$OUT/summary-$TAG.txt"
    [ $run = warm ] && lt first saturation --model single
    for k in ${SAT_CAMERAS:-}; do  # [ $run = warm ]: more cameras a process than the
      [ $run = warm ] || break    # scenario's 16, so that a full batch always waits
      echo "== first closed loop, 8 x $k cameras" | tee -a "$OUT/summary-$TAG.txt"
      PYTHONPATH=$NEW_PATH timeout 150 python3 -m stgcnd loadtest --endpoint \
        "ipc://$TMP/first.sock" --processes 8 --cameras "$k" --closed-loop --duration 15 \
        --warmup 3 --model single --json "$RAW/lt-first-8x$k.json" 2>&1 | tail -14 \
        | tee -a "$OUT/summary-$TAG.txt"
    done
    stop
  done
  PYTHONPATH=$NEW_PATH timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/runtimes/test_torch_compile.py ${TESTS_K:+-k "$TESTS_K"} >"$RAW/pytest.txt" 2>&1
  tail -8 "$RAW/pytest.txt" | tee -a "$OUT/summary-$TAG.txt"
  [ -n "${NO_BENCH:-}" ] || BENCH_S=200 bench --backends torch-cudagraph \
    torch-compile-cudagraph torch.compile --batch 1 64 --persons 1 5
fi

if [ "$PART" = tune ]; then
  # The libraries read once, so that no start below pays the first read of torch from disk.
  python3 -c 'import torch, triton; torch.cuda.init()' 2>/dev/null
  if [ -n "${COLD_DEFAULT_FIRST:-}" ]; then  # READY with the default buckets on a cold store
    config default "$MODEL_M1" ""            # alone, before a run with other BUCKETS;
    tree=$HERE/${COLD_TREE:-}                # COLD_TREE: another checkout's daemon (the old)
    t0=$(date +%s.%N)
    start default "$tree/daemon:$tree/clients:$tree/tools:$tree:${PYTHONPATH:-}" 300 && {
      echo "READY cold, default buckets${COLD_TREE:+ ($COLD_TREE)}:" \
        "$(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s" | tee -a "$OUT/summary-$TAG.txt"
      stop
    }
  fi
  config tune "$MODEL_M1${BUCKETS:+
max_batch = $(echo "$BUCKETS" | tr -d '[] ' | tr ',' '\n' | sort -n | tail -1)
buckets = $BUCKETS}${TUNE_DELAY_US:+
max_queue_delay_us = $TUNE_DELAY_US}" ""
  t0=$(date +%s.%N)
  start tune "$NEW_PATH" 300 || { touch "$OUT/done"; exit 1; }
  ready=$(date +%s.%N)
  echo "READY cold: $(python3 -c "print(round($ready - $t0, 1))") s" | tee -a "$OUT/summary-$TAG.txt"
  deadline=$(( SECONDS + ${TUNE_S:-1200} )); n=0; after=0
  while [ $SECONDS -lt $deadline ]; do
    n=$((n + 1))
    if [ "${TUNE_PROCESSES:-8}" = 0 ]; then  # no cameras: the trials alone (a chunk's wait)
      sleep ${CHUNK_S:-90}; echo "$SECONDS s in: buckets tried" \
        "$(grep -c '"torch_autotune_bucket"' "$RAW/daemon-tune.log")" | tee -a "$OUT/summary-$TAG.txt"
    else
    # The machine's CPU and the GPU's use over the chunk: whether a trial beside the serving
    # contends for the cores or for the GPU.
    cpu0=$(head -1 /proc/stat)
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 \
      >"$RAW/gpu-tune-$n.txt" 2>/dev/null & smi=$!
    PYTHONPATH=$NEW_PATH timeout 150 python3 -m stgcnd loadtest --endpoint "ipc://$TMP/tune.sock" \
      --processes ${TUNE_PROCESSES:-8} --cameras ${TUNE_CAMERAS:-8} --rate 25 \
      --duration ${CHUNK_S:-90} --warmup 2 --model single \
      --json "$RAW/lt-tune-$n.json" >"$RAW/lt-tune-$n.txt" 2>&1
    kill $smi 2>/dev/null; wait $smi 2>/dev/null
    CPU0=$cpu0 CPU1=$(head -1 /proc/stat) python3 - "$RAW/lt-tune-$n.json" "$RAW/daemon-tune.log" \
      "$ready" "$RAW/gpu-tune-$n.txt" <<'EOF2' | tee -a "$OUT/summary-$TAG.txt"
import json, os, sys, time
ticks = [[int(v) for v in os.environ[k].split()[1:]] for k in ("CPU0", "CPU1")]
delta = [b - a for a, b in zip(*ticks)]
busy = 100 * (1 - (delta[3] + delta[4]) / max(1, sum(delta)))  # idle and iowait
gpu = [int(v) for v in open(sys.argv[4]).read().split() if v.isdigit()]
print(f"chunk: machine CPU busy {busy:.0f}% of {os.cpu_count()} cores, GPU utilization "
      f"mean {sum(gpu) / len(gpu) if gpu else float('nan'):.0f}% ({len(gpu)} samples)")
try:
    r = json.load(open(sys.argv[1]))
except Exception as exc:
    print(f"chunk: no report ({exc})"); sys.exit()
log = open(sys.argv[2]).read()
rt = r["round_trip_ms"]
print(f"chunk ending {time.time() - float(sys.argv[3]):.0f} s after READY: "
      f"{r['windows_per_s']:.0f} windows/s, requests {r['requests']}, replies {r['replies']}, "
      f"lost {r['lost_replies']}, error replies {r['error_replies']}, errors {r['errors']}, "
      f"round trip p50 {rt.get('p50')} p99 {rt.get('p99')} max {rt.get('max')} ms; "
      f"buckets tried {log.count('torch_autotune_bucket')}, upgraded "
      f"{log.count('model_upgraded')}")
EOF2
    fi
    if grep -q '"model_upgraded"' "$RAW/daemon-tune.log"; then
      after=$((after + 1)); [ $after -ge ${AFTER_CHUNKS:-2} ] && break
    fi
    grep -q '"upgrade_failed"' "$RAW/daemon-tune.log" && break
  done
  grep '"torch_autotune_bucket"\|"model_upgraded"\|"upgrade_failed"\|"upgrade_started"\|"model_closed"' \
    "$RAW/daemon-tune.log" | cut -c1-900 | tee -a "$OUT/summary-$TAG.txt"
  # What a trial spends timing kernel choices on the GPU it shares with the serving, a bucket
  # at a time (inductor's own lines, on the trial's stderr).
  grep 'AUTOTUNE benchmarking takes\|"torch_autotune_bucket"' "$RAW/daemon-tune.log" | awk \
    '/AUTOTUNE/ {s += $5; n++} /torch_autotune_bucket/ {printf "trial: %d operations autotuned, their kernel choices timed in %.1f s\n", n, s; s = 0; n = 0}' \
    | tee -a "$OUT/summary-$TAG.txt"
  python3 - "$RAW/daemon-tune.log" <<'EOF2' | tee -a "$OUT/summary-$TAG.txt"
import json, sys
from datetime import datetime
at = lambda e: datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
events = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ready = next((at(e) for e in events if e.get("event") == "ready"), None)
for e in events:
    if ready is not None and e.get("event") in ("upgrade_started", "torch_autotune_bucket",
            "model_upgraded", "model_closed", "upgrade_failed", "upgrade_paused"):
        extra = {k: e[k] for k in ("bucket", "mode", "tuned_ms", "default_ms", "why", "ms", "paused_ms")
                 if k in e}
        print(f"{at(e) - ready:7.1f} s after READY: {e['event']} {extra}")
EOF2
  stop
  t0=$(date +%s.%N)
  start tune "$NEW_PATH" 300 && {
    echo "READY warm: $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s" \
      | tee -a "$OUT/summary-$TAG.txt"
    stop
  }
  if [ -n "${BENCH_BY_S:-}" ] && [ $SECONDS -gt "$BENCH_BY_S" ]; then  # a device call's budget
    echo "bench skipped: ${SECONDS} s in, past BENCH_BY_S=$BENCH_BY_S" | tee -a "$OUT/summary-$TAG.txt"
    NO_BENCH=1
  fi
  [ -n "${NO_BENCH:-}" ] || BENCH_S=${BENCH_S:-500} bench --store "$TMP/engines-tune" --backends \
    torch-autotune-cudagraph torch.compile-max-autotune ${DEFAULT_ROW:+torch-compile-cudagraph} --batch 64 \
    --persons 1 --iterations 50
  touch "$OUT/done"
fi

if [ "$PART" = peers ]; then
  # Each user row runs in a fresh process (stgcnd_tools/bench/peer.py). First every row but
  # max-autotune (seconds a shape), then max-autotune one (M, B) at a time (minutes a shape,
  # cold), so that running out of time ends a shape, not the rows already measured. The store
  # (inductor's caches in it) outlives the call: a second call on this machine compiles from it.
  deadline=$(( SECONDS + ${PEERS_S:-450} ))
  peers=${PEERS:-torch.compile-default torch.compile-max-autotune}
  quick=$(echo $peers | tr ' ' '\n' | grep -vx torch.compile-max-autotune | tr '\n' ' ')
  peer_bench() {  # $1 tag, rest: bench args; the rows to $RAW/peers-$1.json
    local tag=$1 left=$(( deadline - SECONDS )); shift
    [ $left -gt 20 ] || { echo "peers $tag: no time left" | tee -a "$OUT/summary-$TAG.txt"; return; }
    PYTHONPATH=$NEW_PATH timeout $left python3 -m stgcnd bench --device cuda --precisions fp16 \
      --iterations ${ITERATIONS:-50} --store /tmp/stgcnd-peers-store \
      --json "$RAW/peers-$tag.json" "$@" >"$RAW/peers-$tag.txt" 2>&1
    echo "peers $tag: exit $? at ${SECONDS}s" | tee -a "$OUT/summary-$TAG.txt"
    grep -E '^\[M=.*(median|skipped)' "$RAW/peers-$tag.txt" | tee -a "$OUT/summary-$TAG.txt"
  }
  for m in ${PERSONS:-1 5}; do
    peer_bench "m$m" --backends torch-compile-cudagraph $quick --batch ${BATCHES:-1 64} --persons $m
  done
  if echo " $peers " | grep -q ' torch.compile-max-autotune '; then
    for m in ${PERSONS:-1 5}; do for b in $(echo ${BATCHES:-1 64} | tr ' ' '\n' | sort -rn); do
      peer_bench "m$m-b$b-autotune" --backends torch.compile-max-autotune --batch $b --persons $m
    done; done
  fi
  PYTHONPATH=$NEW_PATH python3 - "$RAW" <<'EOF' | tee -a "$OUT/summary-$TAG.txt"
import glob, json, sys
from stgcnd_tools.bench.runner import PEER_MODES
from stgcnd_tools.table import table
rows = [r for p in sorted(glob.glob(sys.argv[1] + "/peers-*.json")) for r in json.load(open(p))]
rows.sort(key=lambda r: (r["persons"], r["batch"]))  # by (M, B); each file's order within
ours = {(r["persons"], r["batch"]): r for r in rows if r["backend"] == "torch-compile-cudagraph"}
out = []
for r in rows:
    o = ours.get((r["persons"], r["batch"]))
    if r["backend"] in PEER_MODES:
        print(f"{r['backend']} M={r['persons']} B={r['batch']}: {r['note']}")
    if r["backend"] in PEER_MODES and o:  # by the median; ours/user > 1: ours faster
        out.append((r["persons"], r["batch"], f"{o['median_ms']:.2f}",
                    1e3 * r["batch"] / o["median_ms"], r["backend"], f"{r['median_ms']:.2f}",
                    1e3 * r["batch"] / r["median_ms"], f"{r['median_ms'] / o['median_ms']:.2f}x"))
print("ours = torch-compile-cudagraph (the daemon's runner: compile auto, our CUDA graphs), fp16")
print("\n".join(table(("M", "B", "ours ms", "ours windows/s", "user row", "user ms",
                        "user windows/s", "ours/user"), out, left=0)))
EOF
fi

if [ "$PART" = serve ]; then
  trees=("new:$NEW_PATH")
  [ -n "$OLD" ] && trees=("old:$HERE/$OLD/daemon:$HERE/$OLD/clients:${PYTHONPATH:-}")
  for entry in "${trees[@]}"; do
    name=${entry%%:*}; path=${entry#*:}
    model=$MODEL_M1
    [ "${MODEL:-}" = noop ] && model=${MODEL_M1/\"torch\"/\"noop\"}
    config "$name" "$model" ""
    start "$name" "$path" || continue
    for s in ${SCENARIOS:-one-camera paced-64 saturation joins push}; do
      lt "$name" "$s" --model single  # a scenario measures its floor itself
    done
    # Idle: the daemon's own CPU over 5 s with nobody connected (ticks of 10 ms).
    t0=$(awk '{print $14+$15}' /proc/$DPID/stat); sleep 5
    t1=$(awk '{print $14+$15}' /proc/$DPID/stat)
    echo "idle CPU $name: $(( (t1 - t0) * 10 / 5 )) ms per s ($(( t1 - t0 )) ticks in 5 s)" \
      | tee -a "$OUT/summary-$TAG.txt"
    stop
  done
fi

if [ "$PART" = memory ]; then
  trees=("new:$NEW_PATH")
  [ -n "$OLD" ] && trees+=("old:$HERE/$OLD/daemon:$HERE/$OLD/clients:${PYTHONPATH:-}")
  for entry in "${trees[@]}"; do
    name=${entry%%:*}; path=${entry#*:}
    budget="memory_budget_mb = 6144"
    [ "$name" = old ] && budget=""
    config "mem-$name" "$MODEL_M1
$MODEL_M5" "$budget"
    start "mem-$name" "$path" 600 || continue  # torch.compile: a minute or two a model
    echo "== mem-$name" | tee -a "$OUT/summary-$TAG.txt"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader \
      | tee -a "$OUT/summary-$TAG.txt"
    grep '"memory_plan"' "$RAW/daemon-mem-$name.log" | tee -a "$OUT/summary-$TAG.txt"
    pids=()
    for m in single group; do
      PYTHONPATH=$NEW_PATH timeout 60 python3 -m stgcnd loadtest \
        --endpoint "ipc://$TMP/mem-$name.sock" --model $m --processes 4 --cameras 8 --rate 25 \
        --duration 10 --warmup 2 --json "$RAW/mem-$name-$m.json" >"$RAW/mem-$name-$m.txt" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}"
    for m in single group; do
      echo "-- $m" | tee -a "$OUT/summary-$TAG.txt"
      head -12 "$RAW/mem-$name-$m.txt" | tee -a "$OUT/summary-$TAG.txt"
    done
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader \
      | tee -a "$OUT/summary-$TAG.txt"
    stop
  done
fi
