#!/bin/bash
# The serving core on a GPU, end to end: `stgcnd bench` (the backend's own best batched rate)
# and `stgcnd loadtest` against the daemon, in one session so the numbers compare.
#
# Usage (repo root; wheels for the GPU machine in .whl/ as for scripts/gpu_checks.sh):
#   OUT=dir PART=new bash scripts/gpu_serving_bench.sh   # bench + the batched daemon
#   OUT=dir PART=old bash scripts/gpu_serving_bench.sh   # the per-camera design (.old/)
#   OUT=dir PART=buckets bash scripts/gpu_serving_bench.sh  # three bucket sets, open loop
#   OUT=dir PART=open bash scripts/gpu_serving_bench.sh     # 128 and 64 cameras x 25 Hz, 1 camera
#   OUT=dir PART=cpu bash scripts/gpu_serving_bench.sh   # where the daemon's CPU goes, per thread:
#                                    the ZeroMQ floor, the noop backend, then torch
#   OUT=dir PART=loop bash scripts/gpu_serving_bench.sh  # dispatch "loop" against "thread":
#                                    GPU tests of the loop path, bench, per-thread CPU per mode
#   OUT=dir PART=ab bash scripts/gpu_serving_bench.sh    # the same two, interleaved twice
#   OUT=dir PART=variants bash scripts/gpu_serving_bench.sh  # loop: no client streams; two executors
#   OUT=dir PART=floor bash scripts/gpu_serving_bench.sh  # GPU tests, a batch's host CPU (this
#                                    tree and .base/), the bare ZeroMQ floors (closed, 64 x 25 Hz)
#   OUT=dir PART=abtree bash scripts/gpu_serving_bench.sh  # this tree against .base/ (an
#                                    earlier commit), loop dispatch, interleaved twice
#   OUT=dir PART=final bash scripts/gpu_serving_bench.sh  # GPU tests, bench, the issue's loads
#                                    and 32 cameras joining, on this tree (default dispatch)
#   OUT=dir PART=bucketab bash scripts/gpu_serving_bench.sh  # two bucket sets (SETS, ";"
#                                    between them) at 128 x 25 Hz, interleaved twice
#   OUT=dir PART=instances bash scripts/gpu_serving_bench.sh  # instances = 1 against 2, paced
#   OUT=dir PART=gcab bash scripts/gpu_serving_bench.sh  # gc_freeze on against off, paced
#   OUT=dir PART=profile bash scripts/gpu_serving_bench.sh  # py-spy of the I/O loop at 64 x 25 Hz
#                                    and one camera (Python frames, then native), this tree
#   OUT=dir PART=hold bash scripts/gpu_serving_bench.sh  # one camera: the ZeroMQ floor when the
#                                    echo answers after HOLD_US (asleep, spinning), noop, torch
#   OUT=dir PART=pin bash scripts/gpu_serving_bench.sh  # the daemon on two cores of its own (and
#                                    the load generator on the rest) against the scheduler's choice
#   OUT=dir PART=sparse bash scripts/gpu_serving_bench.sh  # cameras at their real rate (1 and 4
#                                    x 25 Hz): the floor at that rate, noop, torch, .old/ (SDUR s)
#   OUT=dir PART=sparseqos bash scripts/gpu_serving_bench.sh  # one camera at 25 Hz: idle states
#                                    held shallow (PM QoS), the daemon pinned, both, neither
# .old/ holds the previous design's daemon/ and clients/ (git archive 5fdd169 daemon clients).
set -o pipefail
OUT=${OUT:-/tmp/gpu-out}
PART=${PART:-new}
DUR=${DUR:-12}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ] && [ -z "$SKIP_WHL" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
NEW=/tmp/site:$PWD/daemon:$PWD/clients:$PWD
OLD=/tmp/site:$PWD/.old/daemon:$PWD/.old/clients
export PYTHONPATH=$NEW
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"
nproc | sed 's/^/cpus /' | tee -a "$OUT/gpu.txt"
tmp=$(mktemp -d)

start_daemon() {  # $1 name, $2 PYTHONPATH, $3 extra model keys, $4 backend (default torch)
  local model=$'backend = "torch"\ndevice = "cuda"\nprecision = "fp16"\ncuda_graph = true'
  [ "${4:-torch}" = noop ] && model=$'backend = "noop"\ndevice = "cpu"\nprecision = "fp32"'
  cat > "$tmp/$1.toml" <<TOML
[server]
endpoint = "ipc://$tmp/$1.sock"
engines_dir = "$tmp/engines"
stats_interval = 2.0
idle_timeout = 3.0
queue_size = 16
max_cameras = 200
[[models]]
name = "single"
$model
$3
TOML
  # shellcheck disable=SC2086
  PYTHONPATH=$2 $DAEMON_CPUS python3 -m stgcnd --log-format json serve --config "$tmp/$1.toml" \
    > "$OUT/daemon-$1.log" 2>&1 &
  dpid=$!
  for _ in $(seq 1 180); do
    grep -q '"event": "ready"' "$OUT/daemon-$1.log" && return 0
    kill -0 $dpid 2>/dev/null || break
    sleep 1
  done
  echo "daemon $1 did not start"; tail -5 "$OUT/daemon-$1.log"; return 1
}

stop_daemon() {
  kill -TERM $dpid; wait $dpid; echo "daemon exit code $?" | tee -a "$OUT/loadtest.txt"
}

lt() {  # $1 name, $2 label, rest: loadtest args
  local name=$1 label=$2; shift 2
  echo "== $name: $label" | tee -a "$OUT/loadtest.txt"
  # shellcheck disable=SC2086
  timeout 120 $LOAD_CPUS python3 -m stgcnd loadtest --endpoint "ipc://$tmp/$name.sock" --model single \
    --json "$OUT/lt-$name-$label.json" "$@" 2>&1 | tail -25 | tee -a "$OUT/loadtest.txt"
}

suite() {  # $1 daemon name
  sleep 6  # cameras of the previous run are reclaimed (idle_timeout 3 s, checked every 2 s)
  lt "$1" one-closed --processes 1 --cameras 1 --closed-loop --duration "$DUR" --warmup 2
  lt "$1" one-25hz --processes 1 --cameras 1 --rate 25 --duration "$DUR" --warmup 2
  lt "$1" sat-64-closed --processes 8 --cameras 8 --closed-loop --duration "$DUR" --warmup 3
  sleep 6
  spy "$1-sat-128" &
  lt "$1" sat-128-closed --processes 8 --cameras 16 --closed-loop --duration "$DUR" --warmup 3
  wait $!
  sleep 6
  lt "$1" c64-25hz --processes 8 --cameras 8 --rate 25 --duration "$DUR" --warmup 3
  sleep 6
  lt "$1" c128-25hz --processes 8 --cameras 16 --rate 25 --duration "$DUR" --warmup 3
  sleep 6
  lt "$1" join32 --processes 1 --cameras 4 --rate 25 --duration "$DUR" --warmup 1 \
    --join 32 --join-at 4
}

ltc() {  # lt, and the daemon's CPU per thread over the middle of the measured part
  # $1 name, $2 label, $3 offered requests/s (0: closed loop, per-request columns omitted)
  local name=$1 label=$2 rate=$3; shift 3
  ( sleep 6; python3 scripts/thread_cpu.py $dpid $((DUR - 6)) $rate \
      > "$OUT/threads-$name-$label.txt" ) &
  local tpid=$!
  lt "$name" "$label" "$@"
  wait $tpid
  cat "$OUT/threads-$name-$label.txt" | tee -a "$OUT/loadtest.txt"
}

paced_loads() {  # $1 name, $2 "128" adds 128 cameras: one camera, then 64 (and 128) x 25 Hz
  sleep 4
  ltc "$1" one-closed 0 --processes 1 --cameras 1 --closed-loop --duration "$DUR" --warmup 2
  sleep 4
  ltc "$1" c64-25hz 1600 --processes 8 --cameras 8 --rate 25 --duration "$DUR" --warmup 3
  if [ "${2:-}" = 128 ]; then
    sleep 4
    ltc "$1" c128-25hz 3200 --processes 8 --cameras 16 --rate 25 --duration "$DUR" --warmup 3
  fi
}

goal_loads() {  # $1 name: the issue's four loads with per-thread CPU, on a started daemon
  sleep 4
  ltc "$1" one-closed 0 --processes 1 --cameras 1 --closed-loop --duration "$DUR" --warmup 2
  sleep 6
  ltc "$1" c64-25hz 1600 --processes 8 --cameras 8 --rate 25 --duration "$DUR" --warmup 3
  sleep 6
  ltc "$1" c128-25hz 3200 --processes 8 --cameras 16 --rate 25 --duration "$DUR" --warmup 3
  sleep 6
  ltc "$1" sat-128-closed 0 --processes 8 --cameras 16 --closed-loop --duration "$DUR" \
    --warmup 3
}

spy() {  # $1 label: where the daemon's threads spend the saturated run (py-spy, if carried)
  [ -x /tmp/site/bin/py-spy ] || return 0
  sleep 6
  /tmp/site/bin/py-spy record -p $dpid -d 5 -r 250 -f raw --threads --idle \
    -o "$OUT/spy-$1.txt" > /dev/null 2>&1 || echo "py-spy failed for $1"
}

rc=0
if [ "$PART" = new ]; then
  timeout 200 python3 -m pytest -q -rfs -p no:cacheprovider -o addopts="" \
    tests/backends/test_runner.py tests/backends/test_gpu.py > "$OUT/pytest_gpu.txt" 2>&1 || rc=1
  tail -3 "$OUT/pytest_gpu.txt"
  timeout 200 python3 -m stgcnd bench --device cuda --backends torch-cudagraph \
    --precisions fp16 --batch 1 16 64 --persons 1 --json "$OUT/bench.json" 2>&1 \
    | tail -8 | tee "$OUT/bench.txt"
  python3 -c "import pycuda.driver as c; print('pycuda BLOCKING_SYNC', int(c.event_flags.BLOCKING_SYNC))"
  start_daemon new "$NEW" $'demo = true\nmax_batch = 64' || exit 1
  suite new
  stop_daemon
  # Variants: no client streams (a batch moves in one copy each way); two executors.
  start_daemon nolanes "$NEW" $'demo = true\nmax_batch = 64\nclient_streams = false' || exit 1
  lt nolanes one-closed --processes 1 --cameras 1 --closed-loop --duration "$DUR" --warmup 2
  lt nolanes sat-128-closed --processes 8 --cameras 16 --closed-loop --duration "$DUR" --warmup 3
  stop_daemon
  start_daemon two "$NEW" $'demo = true\nmax_batch = 64\ninstances = 2' || exit 1
  spy two-sat-128 &
  lt two sat-128-closed --processes 8 --cameras 16 --closed-loop --duration "$DUR" --warmup 3
  wait $!
  stop_daemon
fi
if [ "$PART" = open ]; then
  # The open-loop loads alone (a short re-run when a noisy machine spoilt them).
  start_daemon open "$NEW" $'demo = true\nmax_batch = 64' || exit 1
  lt open c128-25hz --processes 8 --cameras 16 --rate 25 --duration "$DUR" --warmup 3
  sleep 6
  lt open c64-25hz --processes 8 --cameras 8 --rate 25 --duration "$DUR" --warmup 3
  lt open one-closed --processes 1 --cameras 1 --closed-loop --duration "$DUR" --warmup 2
  stop_daemon
fi
if [ "$PART" = cpu ]; then
  # The floor (bare ZeroMQ round trip), then the daemon's CPU per thread: noop (the daemon
  # alone) and torch (plus the GPU path), at the loads of the issue's goals.
  python3 scripts/zmq_echo_floor.py 20000 | tee -a "$OUT/loadtest.txt"
  for backend in ${BACKENDS:-noop torch}; do
    start_daemon "cpu-$backend" "$NEW" "demo = true
max_batch = 64" "$backend" || exit 1
    goal_loads "cpu-$backend"
    stop_daemon
  done
  if [ -d .base ]; then  # the same two open-loop loads on an earlier tree (.base/), same machine
    BASE=/tmp/site:$PWD/.base/daemon:$PWD/.base/clients
    start_daemon cpu-base "$BASE" $'demo = true\nmax_batch = 64' || exit 1
    sleep 4
    ltc cpu-base one-closed 0 --processes 1 --cameras 1 --closed-loop --duration "$DUR" \
      --warmup 2
    sleep 6
    ltc cpu-base c64-25hz 1600 --processes 8 --cameras 8 --rate 25 --duration "$DUR" --warmup 3
    stop_daemon
  fi
fi
if [ "$PART" = loop ]; then
  # The loop-driven dispatch against executor threads, same machine, same run: the GPU tests
  # of the loop path, bench, the ZeroMQ floor, then torch (and noop) daemons in each mode with
  # the daemon's CPU per thread at the issue's loads.
  # shellcheck disable=SC2086
  timeout 300 python3 -m pytest -q -rfs -p no:cacheprovider -o addopts="" \
    ${TESTS:-tests/backends/test_runner.py tests/server/test_loop_dispatch.py} \
    > "$OUT/pytest_gpu.txt" 2>&1 || rc=1
  tail -3 "$OUT/pytest_gpu.txt"
  timeout 200 python3 -m stgcnd bench --device cuda --backends torch-cudagraph \
    --precisions fp16 --batch 1 16 64 --persons 1 --json "$OUT/bench.json" 2>&1 \
    | tail -8 | tee "$OUT/bench.txt"
  python3 scripts/zmq_echo_floor.py 20000 | tee -a "$OUT/loadtest.txt"
  for mode in ${MODES:-loop thread}; do
    start_daemon "torch-$mode" "$NEW" "demo = true
max_batch = 64
dispatch = \"$mode\"" || exit 1
    goal_loads "torch-$mode"
    if [ "$mode" = loop ]; then
      sleep 6
      lt "torch-$mode" join32 --processes 1 --cameras 4 --rate 25 --duration "$DUR" \
        --warmup 1 --join 32 --join-at 4
    fi
    stop_daemon
  done
  start_daemon noop-loop "$NEW" $'demo = true\nmax_batch = 64' noop || exit 1
  sleep 4
  ltc noop-loop one-closed 0 --processes 1 --cameras 1 --closed-loop --duration "$DUR" --warmup 2
  sleep 6
  ltc noop-loop c64-25hz 1600 --processes 8 --cameras 8 --rate 25 --duration "$DUR" --warmup 3
  stop_daemon
fi
if [ "$PART" = ab ]; then
  # dispatch "loop" and "thread" interleaved (loop, thread, loop, thread), so that a noisy
  # spell of the shared machine cannot favour one; a native py-spy of the loop's thread.
  for round in 1 2; do
    for mode in loop thread; do
      start_daemon "$mode$round" "$NEW" "demo = true
max_batch = 64
dispatch = \"$mode\"" || exit 1
      sleep 4
      ltc "$mode$round" one-closed 0 --processes 1 --cameras 1 --closed-loop \
        --duration "$DUR" --warmup 2
      spid=
      if [ "$round$mode" = 1loop ] && [ -x /tmp/site/bin/py-spy ]; then
        ( sleep 5; /tmp/site/bin/py-spy record -p $dpid -d 4 -r 500 -f raw --native \
            -o "$OUT/spy-loop-c64.txt" > /dev/null 2>&1 ) &
        spid=$!
      fi
      sleep 4
      ltc "$mode$round" c64-25hz 1600 --processes 8 --cameras 8 --rate 25 --duration "$DUR" \
        --warmup 3
      [ -n "$spid" ] && wait $spid
      stop_daemon
    done
  done
fi
if [ "$PART" = variants ]; then
  # The loop dispatch with no client streams (a batch moves in one copy each way: fewer driver
  # calls per window) and with two executors (two batches on the GPU at once).
  start_daemon loopnolanes "$NEW" $'demo = true\nmax_batch = 64\nclient_streams = false' \
    || exit 1
  sleep 4
  ltc loopnolanes one-closed 0 --processes 1 --cameras 1 --closed-loop --duration "$DUR" \
    --warmup 2
  sleep 4
  ltc loopnolanes c64-25hz 1600 --processes 8 --cameras 8 --rate 25 --duration "$DUR" --warmup 3
  sleep 6
  ltc loopnolanes sat-128-closed 0 --processes 8 --cameras 16 --closed-loop --duration "$DUR" \
    --warmup 3
  stop_daemon
  start_daemon looptwo "$NEW" $'demo = true\nmax_batch = 64\ninstances = 2' || exit 1
  sleep 4
  ltc looptwo sat-128-closed 0 --processes 8 --cameras 16 --closed-loop --duration "$DUR" \
    --warmup 3
  sleep 6
  ltc looptwo c128-25hz 3200 --processes 8 --cameras 16 --rate 25 --duration "$DUR" --warmup 3
  stop_daemon
fi
if [ "$PART" = floor ]; then
  # shellcheck disable=SC2086
  timeout 300 python3 -m pytest -q -rfs -p no:cacheprovider -o addopts="" \
    ${TESTS:-tests/backends/test_runner.py tests/backends/test_gpu.py \
    tests/server/test_loop_dispatch.py} > "$OUT/pytest_gpu.txt" 2>&1 || rc=1
  tail -3 "$OUT/pytest_gpu.txt"
  echo "== a batch's host CPU, this tree" | tee -a "$OUT/launch.txt"
  timeout 120 python3 scripts/gpu_launch_cost.py 2000 2>&1 | grep -v '^{' | tee -a "$OUT/launch.txt"
  if [ -d .base ]; then
    echo "== a batch's host CPU, .base ($(cat .base/COMMIT 2>/dev/null))" | tee -a "$OUT/launch.txt"
    PYTHONPATH=/tmp/site:$PWD/.base/daemon:$PWD/.base/clients timeout 120 \
      python3 scripts/gpu_launch_cost.py 2000 2>&1 | grep -v '^{' | tee -a "$OUT/launch.txt"
  fi
  python3 scripts/zmq_echo_floor.py 20000 | tee -a "$OUT/floor.txt"
  python3 scripts/zmq_echo_floor.py --open 8 8 25 12 | tee -a "$OUT/floor.txt"
  python3 scripts/zmq_echo_floor.py --open 8 16 25 12 | tee -a "$OUT/floor.txt"
fi
if [ "$PART" = abtree ]; then
  # This tree against .base/ with the same config (loop dispatch, torch fp16 graphs),
  # interleaved (this, base, this, base) so that a noisy spell cannot favour one.
  BASE=/tmp/site:$PWD/.base/daemon:$PWD/.base/clients
  for round in 1 2; do
    for tree in new base; do
      path=$NEW; [ "$tree" = base ] && path=$BASE
      start_daemon "$tree$round" "$path" $'demo = true\nmax_batch = 64' ${BACKEND:-torch} \
        || exit 1
      paced_loads "$tree$round"
      stop_daemon
    done
  done
fi
if [ "$PART" = final ]; then
  if [ "${TESTS:-}" != none ]; then  # TESTS=none: the loads only
    # shellcheck disable=SC2086
    timeout 300 python3 -m pytest -q -rfs -p no:cacheprovider -o addopts="" \
      ${TESTS:-tests/backends tests/server/test_loop_dispatch.py} > "$OUT/pytest_gpu.txt" \
      2>&1 || rc=1
    tail -3 "$OUT/pytest_gpu.txt"
  fi
  timeout 200 python3 -m stgcnd bench --device cuda --backends torch-cudagraph \
    --precisions fp16 --batch 1 16 64 --persons 1 --json "$OUT/bench.json" 2>&1 \
    | tail -8 | tee "$OUT/bench.txt"
  start_daemon final "$NEW" $'demo = true\nmax_batch = 64' || exit 1
  goal_loads final
  sleep 6
  lt final join32 --processes 1 --cameras 4 --rate 25 --duration "$DUR" --warmup 1 \
    --join 32 --join-at 4
  stop_daemon
fi
if [ "$PART" = bucketab ]; then
  IFS=';' read -r -a sets <<< "${SETS:-1, 2, 4, 8, 16, 24, 32, 48, 64;1, 2, 4, 8, 12, 16, 24, 32, 48, 64}"
  for round in 1 2; do
    i=0
    for set in "${sets[@]}"; do
      i=$((i + 1))
      echo "== set$i round $round: [$set]" | tee -a "$OUT/loadtest.txt"
      start_daemon "set$i-$round" "$NEW" "demo = true
max_batch = 64
buckets = [$set]" || exit 1
      sleep 3
      lt "set$i-$round" c128-25hz --processes 8 --cameras 16 --rate 25 --duration "$DUR" \
        --warmup 3
      stop_daemon
    done
  done
fi
if [ "$PART" = instances ]; then
  # One executor against two (each its own graphs, buffers and streams, one shared queue),
  # interleaved twice, at the issue's three paced loads.
  for round in 1 2; do
    for n in 1 2; do
      start_daemon "inst$n-$round" "$NEW" "demo = true
max_batch = 64
instances = $n" || exit 1
      paced_loads "inst$n-$round" 128
      stop_daemon
    done
  done
fi
if [ "$PART" = gcab ]; then
  # The heap frozen at READY (gc_freeze, the default) against not, interleaved twice, at the
  # two paced loads; the daemons' "gc" log lines say how long the collector's passes took.
  for round in 1 2; do
    for freeze in true false; do
      name="gc-$freeze-$round"
      STGCND_GC_FREEZE=$freeze start_daemon "$name" "$NEW" $'demo = true\nmax_batch = 64' \
        || exit 1
      sleep 4
      lt "$name" c64-25hz --processes 8 --cameras 8 --rate 25 --duration "$DUR" --warmup 3
      sleep 5
      lt "$name" c128-25hz --processes 8 --cameras 16 --rate 25 --duration "$DUR" --warmup 3
      stop_daemon
      grep '"event": "gc"' "$OUT/daemon-$name.log" | tail -1 | tee -a "$OUT/loadtest.txt"
    done
  done
fi
if [ "$PART" = hold ]; then
  # One camera's overhead against the transport's floor when every thread on the path idles
  # while the GPU computes: the bare ZeroMQ echo answering at once, after a sleep as long as
  # the model's batch of one, and after spinning that long; then noop and torch daemons.
  for round in 1 2; do
    for h in "0" "${HOLD_US:-560}" "${HOLD_US:-560} --spin"; do
      # shellcheck disable=SC2086
      python3 scripts/zmq_echo_floor.py 8000 --hold-us $h | tee -a "$OUT/loadtest.txt"
    done
  done
  for backend in noop torch; do
    start_daemon "hold-$backend" "$NEW" $'demo = true\nmax_batch = 64' $backend || exit 1
    sleep 3
    for round in 1 2; do
      lt "hold-$backend" "one-closed-$round" --processes 1 --cameras 1 --closed-loop \
        --duration "$DUR" --warmup 2
    done
    stop_daemon
  done
fi
if [ "$PART" = pin ]; then
  # Does the daemon pay for cold cores? At 25 Hz per camera the loop sleeps between most
  # requests, and the kernel may wake it on any of the host's cores, whose caches hold
  # someone else's data. Pinned: the daemon (its loop and ZeroMQ's I/O thread) on cores 0-1,
  # the load generator on the others (systemd's CPUAffinity= does the same for the unit).
  last=$(($(nproc) - 1))
  for round in 1 2; do
    for pin in free pinned; do
      DAEMON_CPUS=; LOAD_CPUS=
      [ $pin = pinned ] && DAEMON_CPUS="taskset -c 0,1" && LOAD_CPUS="taskset -c 2-$last"
      start_daemon "$pin$round" "$NEW" $'demo = true\nmax_batch = 64' || exit 1
      paced_loads "$pin$round" 128
      stop_daemon
      DAEMON_CPUS=; LOAD_CPUS=
    done
  done
fi
if [ "$PART" = sparse ]; then
  # A camera sends 25 windows a second, not back to back: between its requests every thread on
  # the path (the camera's, both ZeroMQ I/O threads, the daemon's loop) and the GPU idle for
  # most of 40 ms. The floor at that rate, then the daemons at it, interleaved with .old/ (the
  # per-camera design the issue measured at 1.5 ms) where it was carried.
  SDUR=${SDUR:-16}
  for round in 1 2; do
    for h in 0 "${HOLD_US:-560}"; do
      python3 scripts/zmq_echo_floor.py $((SDUR * 25)) --hold-us "$h" --rate 25 \
        | tee -a "$OUT/loadtest.txt"
    done
  done
  start_daemon sparse-noop "$NEW" $'demo = true\nmax_batch = 64' noop || exit 1
  sleep 3
  lt sparse-noop one-25hz --processes 1 --cameras 1 --rate 25 --duration "$SDUR" --warmup 2
  stop_daemon
  for round in 1 2; do
    for tree in ${TREES:-new old}; do
      [ "$tree" = old ] && [ ! -d .old/daemon ] && continue
      if [ "$tree" = new ]; then
        start_daemon "new$round" "$NEW" $'demo = true\nmax_batch = 64' ${BACKEND:-torch} \
          || exit 1
      else
        start_daemon "old$round" "$OLD" "warm_sessions = 8" || exit 1
      fi
      sleep 3
      lt "$tree$round" one-closed --processes 1 --cameras 1 --closed-loop --duration "$DUR" \
        --warmup 2
      sleep 4
      lt "$tree$round" one-25hz --processes 1 --cameras 1 --rate 25 --duration "$SDUR" --warmup 2
      sleep 4
      lt "$tree$round" four-25hz --processes 1 --cameras 4 --rate 25 --duration "$SDUR" \
        --warmup 2
      stop_daemon
    done
  done
fi
if [ "$PART" = sparseqos ]; then
  # Between a camera's windows the cores idle for 40 ms, long enough for deep idle states whose
  # exit latency every request then pays. A PM QoS request (/dev/cpu_dma_latency, held open)
  # keeps every core in shallow states; pinning keeps the loop on a core whose caches are its
  # own. Each alone and together, toggled around the same daemon, twice.
  SDUR=${SDUR:-12}
  last=$(($(nproc) - 1))
  qos_on() {
    python3 -c 'import os, struct, time
fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
os.write(fd, struct.pack("i", 0))
time.sleep(3600)' &
    qpid=$!
    sleep 0.5
  }
  qos_off() { kill "$qpid"; wait "$qpid" 2>/dev/null; }
  for round in 1 2; do
    for q in off on; do
      [ $q = on ] && qos_on
      echo "== floor, pm qos $q" | tee -a "$OUT/loadtest.txt"
      python3 scripts/zmq_echo_floor.py $((SDUR * 25)) --hold-us "${HOLD_US:-560}" --rate 25 \
        | tee -a "$OUT/loadtest.txt"
      [ $q = on ] && qos_off
    done
  done
  pins="free pinned"
  [ "$last" -lt 3 ] && pins=free  # two cores for the daemon and at least two for the load
  for pin in $pins; do
    DAEMON_CPUS=; LOAD_CPUS=
    [ $pin = pinned ] && DAEMON_CPUS="taskset -c 0,1" && LOAD_CPUS="taskset -c 2-$last"
    start_daemon "$pin" "$NEW" $'demo = true\nmax_batch = 64' ${BACKEND:-torch} || exit 1
    sleep 3
    for round in 1 2; do
      for q in off on; do
        [ $q = on ] && qos_on
        lt "$pin" "one-25hz-qos-$q-$round" --processes 1 --cameras 1 --rate 25 \
          --duration "$SDUR" --warmup 2
        [ $q = on ] && qos_off
        sleep 2
      done
    done
    stop_daemon
    DAEMON_CPUS=; LOAD_CPUS=
  done
fi
if [ "$PART" = profile ]; then
  start_daemon prof "$NEW" $'demo = true\nmax_batch = 64' ${BACKEND:-torch} || exit 1
  sleep 4
  for load in c64-25hz one-closed; do
    args="--processes 8 --cameras 8 --rate 25"
    [ "$load" = one-closed ] && args="--processes 1 --cameras 1 --closed-loop"
    # shellcheck disable=SC2086
    ( sleep 5; /tmp/site/bin/py-spy record -p $dpid -d 4 -r 1000 -f raw --nonblocking \
        -o "$OUT/spy-py-$load.txt" > /dev/null 2>&1
      /tmp/site/bin/py-spy record -p $dpid -d 3 -r 500 -f raw --native \
        -o "$OUT/spy-native-$load.txt" > /dev/null 2>&1 ) &
    spid=$!
    # shellcheck disable=SC2086
    lt prof "$load" $args --duration 14 --warmup 2
    wait $spid
    sleep 4
  done
  stop_daemon
fi
if [ "$PART" = buckets ]; then
  # Bucket granularity under open-loop load: a batch of 40 padded to 64 computes as 64, and the
  # longer cycle then gathers bigger batches again (the 128 x 25 Hz run settles at bucket 64).
  i=0
  for set in "1, 2, 4, 8, 16, 32, 64" "1, 2, 4, 8, 16, 24, 32, 48, 64" \
             "1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64"; do
    i=$((i + 1))
    echo "== buckets$i: [$set]" | tee -a "$OUT/loadtest.txt"
    start_daemon "buckets$i" "$NEW" "demo = true
max_batch = 64
buckets = [$set]" || exit 1
    grep -o '"seconds": [0-9.]*' "$OUT/daemon-buckets$i.log" | head -1 | tee -a "$OUT/loadtest.txt"
    lt "buckets$i" c128-25hz --processes 8 --cameras 16 --rate 25 --duration "$DUR" --warmup 3
    sleep 6
    lt "buckets$i" c64-25hz --processes 8 --cameras 8 --rate 25 --duration "$DUR" --warmup 3
    sleep 6
    lt "buckets$i" sat-128-closed --processes 8 --cameras 16 --closed-loop --duration "$DUR" \
      --warmup 3
    stop_daemon
  done
fi
if [ "$PART" = old ]; then
  # The per-camera design (one thread and session per camera), same model and precision.
  start_daemon old "$OLD" "warm_sessions = 8" || exit 1
  suite old
  stop_daemon
fi
exit $rc
