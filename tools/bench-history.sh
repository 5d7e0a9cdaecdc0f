#!/usr/bin/env bash
# What history costs the pipeline, with and without retention: a `flowmesh dev` stack of 4 workers
# (its nats-server with its monitoring port open), then the bench as a client: TASKS workflows at
# RATE/s, a burst of BURST, IDLE seconds of nothing, and TASKS at RATE/s again. Between steps it
# prints the event log's messages and subjects and the server's memory (from the monitoring
# port). Needs a release build (`cargo build --release --bins`), curl and python3.
#
#   tools/bench-history.sh KEEP_SEC [TASKS RATE BURST IDLE]    (defaults 20000 1400 200000 150)
#
# KEEP_SEC is the router's kept period (`--keep-ended-sec`; 0 keeps everything). The bench's JSON
# of each step is left in target/bench-history-KEEP_SEC/. BENCHMARKS.md, "Fifteenth round".
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/scratch.sh
scratch_start bench-history
keep=$1 tasks=${2:-20000} rate=${3:-1400} burst=${4:-200000} idle=${5:-150}
bin=$PWD/target/release/flowmesh
out=$PWD/target/bench-history-$keep
mkdir -p "$out"
port=$(free_port) monitor=$(free_port)
real=$(command -v nats-server)
printf '#!/bin/sh\nexec %s "$@" -m %s\n' "$real" "$monitor" > "$dir/nats-server"
chmod +x "$dir/nats-server"
"$bin" dev --workers 4 --data "$dir/data" --port "$port" --keep-ended-sec "$keep" --nats-server "$dir/nats-server" \
  > "$dir/dev.log" 2>&1 & pids+=($!)
export NATS_URL=nats://127.0.0.1:$port
wait_until "the dev stack" "$bin" worker list --json
log_state() {
  local jsz varz
  jsz=$(curl -sf "http://127.0.0.1:$monitor/jsz?streams=true")
  varz=$(curl -sf "http://127.0.0.1:$monitor/varz")
  python3 - "$1" "$jsz" "$varz" <<'EOF'
import json, sys
step, jsz, varz = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
events = [s for a in jsz["account_details"] for s in a["stream_detail"] if s["name"] == "FLOWMESH_EVENTS"][0]["state"]
print(f"{step}: event log {events['messages']} messages, {events.get('num_subjects')} subjects, "
      f"{events['bytes'] >> 20} MiB; nats-server {json.loads(sys.argv[3])['mem'] >> 20} MiB resident")
EOF
}
summary() {
  python3 - "$1" "$out/$1.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[2]))
s = d["submit_to_start_ms"]
print(f"{sys.argv[1]}: {d['tasks_per_sec']:.0f} tasks/s, submit->start p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms, "
      f"max {s['max']:.1f} ms; CPU ms/task {d['cpu_ms_per_task']}")
EOF
}
"$bin" bench --tasks "$tasks" --rate "$rate" --mix echo=1 --json > "$out/before.json"
summary before
log_state "after the first $tasks"
"$bin" bench --tasks "$burst" --concurrency 256 --mix echo=1 --json --timeout-sec 580 > "$out/burst.json"
summary burst
log_state "after the burst"
sleep "$idle" # the measured history ages: nothing to wait for but time
log_state "after $idle s idle"
"$bin" bench --tasks "$tasks" --rate "$rate" --mix echo=1 --json > "$out/after.json"
summary after
log_state "after the last $tasks"
