#!/usr/bin/env bash
# Runs every document in examples/valid end to end on this machine's CPU, with the ML runners and
# tiny local models substituted for the hub ids (FLOWMESH_MODEL_MAP) and a tiny dataset for every
# dataset name (FLOWMESH_DATASETS_DIR). A `flowmesh dev` stack gives echo and python; a second
# worker has the runners and simulated GPUs named like the examples' requests (the runners still
# run on the CPU: torch sees no CUDA device). Prints one line per example and "N of M completed".
# Needs `cargo build` and ./tools/install-deps.sh --ml. Arguments: documents to run instead of all.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
docs=("$@")
[ ${#docs[@]} -gt 0 ] || docs=("$repo"/examples/valid/*.yaml)
docs=("${docs[@]/#examples/$repo/examples}")
export PATH="$repo/target/debug:$PATH"
source "$repo/tools/scratch.sh"
scratch_start ml-examples
work=$dir
port=$(free_port)
cd "$work"
export NATS_URL="nats://127.0.0.1:$port"
python3 -m flowmesh_runners.tiny ./tiny >/dev/null 2>tiny.log
flowmesh dev --data ./data --no-worker-grace-sec 15 --port "$port" >dev.log 2>&1 &
pids+=($!)
gib=$((1 << 30))
hw=$(cat <<JSON
{"cpu_cores": 32, "memory_bytes": $((256 * gib)), "gpus": [
  {"index": 0, "uuid": "GPU-sim-0", "name": "NVIDIA H100 80GB HBM3", "memory_bytes": $((80 * gib))},
  {"index": 1, "uuid": "GPU-sim-1", "name": "NVIDIA A100-SXM4-80GB", "memory_bytes": $((80 * gib))},
  {"index": 2, "uuid": "GPU-sim-2", "name": "NVIDIA L40S", "memory_bytes": $((48 * gib))}]}
JSON
)
FLOWMESH_SIMULATE_HW="$hw" FLOWMESH_RUNNERS=python3 FLOWMESH_MODEL_MAP="$work/tiny/models.json" \
  FLOWMESH_DATASETS_DIR="$work/tiny/datasets" HF_HUB_OFFLINE=1 WORKER_ID=ml-cpu \
  flowmesh worker >ml.log 2>&1 &
pids+=($!)
# The runners answer in the background, after importing torch: wait until trl is listed.
wait_sec=300 wait_until "the worker's runners" bash -c "flowmesh worker info ml-cpu | grep -q '\"trl\"'"
flowmesh worker list
done_n=0; total=0
for doc in "${docs[@]}"; do
  total=$((total + 1))
  name=$(basename "$doc")
  start=$(date +%s)
  set +e; timeout 600 flowmesh submit "$doc" --watch >"$name.out" 2>"$name.err"; code=$?; set -e
  secs=$(( $(date +%s) - start ))
  if [ "$code" = 0 ]; then
    done_n=$((done_n + 1)); echo "completed  ${secs}s  $name"
  else
    # The first stage failure as the watch printed it: "<stage> failed: <message> (<reason>)".
    why=$(grep -hE ' failed: ' "$name.err" "$name.out" | head -1 | sed -E 's/^ +//' | cut -c1-240)
    echo "not done   ${secs}s  $name  ${why:-exit $code}"
  fi
done
echo "examples: $done_n of $total completed on CPU"
