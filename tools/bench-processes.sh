#!/usr/bin/env bash
# `flowmesh bench` against the stack run as separate processes (a private nats-server on a free
# loopback port, flowmesh-validator, flowmesh-router and N flowmesh-worker), so the bench reports
# CPU per task and peak memory for each service on its own. (`bench --dev` runs them all in one
# process.) Uses the release binaries: build them first with `cargo build --release --bins`
# (FLOWMESH_BIN names another folder of them, to compare two builds).
#
#   tools/bench-processes.sh [--workers N] [--slots N] [--prefetch N] [bench arguments…]
#   tools/bench-processes.sh --workers 4 --tasks 100000 --concurrency 10000 --mix echo=1
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${FLOWMESH_BIN:-target/release}
workers=4
slots=2
prefetch=() # the worker's default unless given
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --prefetch) prefetch=(--worker-prefetch "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
for b in flowmesh flowmesh-validator flowmesh-router flowmesh-worker; do
  [ -x "$bin/$b" ] || { echo "bench-processes: $bin/$b is missing; run cargo build --release --bins" >&2; exit 1; }
done
command -v nats-server >/dev/null || { echo "bench-processes: nats-server is not on PATH; run ./tools/install-deps.sh" >&2; exit 1; }

source tools/scratch.sh
scratch_start bench-processes
port=$(free_port)
# The settings flowmesh dev gives its server: its streams synced every 200 ms, and no subscription
# cache, which nearly every subject we publish only churns (ARCHITECTURE, "Decisions").
printf 'listen: 127.0.0.1:%s\njetstream { store_dir: "%s/js", sync_interval: "200ms" }\ndisable_sublist_cache: true\n' "$port" "$dir" >"$dir/nats.conf"
# The collector's pace that flowmesh dev and compose.yaml give the server (ARCHITECTURE, "Decisions").
GOGC=${GOGC:-400} nats-server -c "$dir/nats.conf" >"$dir/nats.log" 2>&1 &
pids+=($!)
export NATS_URL="nats://127.0.0.1:$port" RUST_LOG=warn
wait_until nats-server bash -c "exec 3<>/dev/tcp/127.0.0.1/$port"
"$bin/flowmesh-validator" >"$dir/validator.log" 2>&1 &
pids+=($!)
"$bin/flowmesh-router" --router-id bench-router >"$dir/router.log" 2>&1 &
pids+=($!)
for n in $(seq "$workers"); do
  WORKER_ID="bench-worker-$n" RESULTS_DIR="$dir/results-$n" HEARTBEAT_INTERVAL_SEC=2 \
    "$bin/flowmesh-worker" --worker-batch-slots "$slots" "${prefetch[@]}" >"$dir/worker-$n.log" 2>&1 &
  pids+=($!)
done
live_workers() { [ "$("$bin/flowmesh" worker list 2>/dev/null | grep -c 'bench-worker-')" -ge "$workers" ]; }
wait_until "$workers workers" live_workers
"$bin/flowmesh" bench "${args[@]}"
