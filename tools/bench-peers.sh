#!/usr/bin/env bash
# The peers of BENCHMARKS' comparison on this machine, in the shape of the issue "Throughput":
# four workers with one slot each (two serve echo, two serve echo and train), tasks alternating
# echo and train with a 200-byte payload, a burst of N, timed from the first submission to the
# last result. Celery 5.4 with Redis as broker and result backend (default settings: prefetch 4,
# RDB snapshots), and Ray 2.40 on one node (four CPUs, "train" a custom resource of two).
# FlowMesh's figure beside them is
#   target/release/flowmesh bench --dev --tasks N --concurrency N --workers 4 --slots 1 --mix echo=1
# whose four workers all serve echo (the peers' rates are the same without the gating: BENCHMARKS).
# Needs redis-server on PATH (Debian's package); installs celery, redis-py and ray through pip.
#
#   tools/bench-peers.sh [N]        (default 2000)
set -euo pipefail
n=${1:-2000}
command -v redis-server >/dev/null || { echo "bench-peers: redis-server is not on PATH (apt-get install redis-server)" >&2; exit 1; }
python3 -m pip install --quiet --disable-pip-version-check "celery==5.4.0" "redis==6.2.0" "ray==2.40.0"
source "$(dirname "$0")/scratch.sh"
scratch_start bench-peers
cd "$dir"

cat >peerapp.py <<'EOF'
import os
from celery import Celery

url = os.environ["PEER_REDIS_URL"]
app = Celery("peer", broker=url, backend=url)
app.conf.task_routes = {"peerapp.echo": {"queue": "echo"}, "peerapp.train": {"queue": "train"}}


@app.task
def echo(payload):
    return payload


@app.task
def train(payload):
    return payload
EOF

cat >celery_submit.py <<'EOF'
import sys, time
from peerapp import echo, train

n = int(sys.argv[1])
payload = "x" * 200
start = time.perf_counter()
results = [(echo if i % 2 == 0 else train).apply_async((payload,)) for i in range(n)]
assert all(r.get(timeout=300) == payload for r in results)
wall = time.perf_counter() - start
print(f"celery + redis: {n} tasks in {wall:.2f} s = {n / wall:.0f} tasks/s")
EOF

cat >ray_bench.py <<'EOF'
import sys, time
import ray

ray.init(num_cpus=4, resources={"train": 2}, include_dashboard=False, logging_level="ERROR")


@ray.remote(num_cpus=1)
def echo(payload):
    return payload


@ray.remote(num_cpus=1, resources={"train": 1})
def train(payload):
    return payload


payload = "x" * 200
# Start the worker processes before the clock does, as the other two start theirs.
ray.get([echo.remote(payload) for _ in range(8)] + [train.remote(payload) for _ in range(8)])
n = int(sys.argv[1])
start = time.perf_counter()
refs = [(echo if i % 2 == 0 else train).remote(payload) for i in range(n)]
assert all(r == payload for r in ray.get(refs))
wall = time.perf_counter() - start
print(f"ray (one node): {n} tasks in {wall:.2f} s = {n / wall:.0f} tasks/s")
ray.shutdown()
EOF

port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" >"$dir/redis.log" 2>&1 &
pids+=($!)
export PEER_REDIS_URL="redis://127.0.0.1:$port/0"
wait_until redis-server redis-cli -p "$port" ping
for queues in echo echo echo,train echo,train; do
  celery -A peerapp worker -Q "$queues" -c 1 -P solo --loglevel=warning >>"$dir/celery.log" 2>&1 &
  pids+=($!)
done
four_workers() { [ "$(celery -A peerapp inspect ping 2>/dev/null | grep -c pong)" -ge 4 ]; }
wait_until "four celery workers" four_workers
python3 celery_submit.py "$n"
python3 ray_bench.py "$n" 2>&1 | tail -1
