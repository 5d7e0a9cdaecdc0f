#!/usr/bin/env bash
# On a machine with a real NVIDIA GPU: prints what the worker's probe finds (NVML and the ML
# runners), then runs a workflow on that GPU end to end through a local stack: a LoRA fine-tune
# (TRL) of a tiny random-weight Llama that `flowmesh_runners.tiny` builds, then inference with the
# adapter it produced, and beside them a retrieval with a tiny sentence-transformers embedder,
# each stage asking for one GPU; the worker is a plain `flowmesh worker` with nothing simulated.
# Writes what it saw into OUT_DIR (default ./gpu-check): the probe, nvidia-smi's list of compute
# processes sampled while the tasks ran, each task's results.json and the logs. Needs `flowmesh` and `nats-server` on PATH and the runners importable by python3
# (PYTHONPATH=services/flowmesh-runners will do). Exit status 0 only when the workflow completed
# and every stage's result says it ran on cuda.
set -euo pipefail
out=$(mkdir -p "${1:-gpu-check}" && cd "${1:-gpu-check}" && pwd)
source "$(dirname "$0")/scratch.sh"
scratch_start gpu-check
cd "$dir"

nvidia-smi -L | tee "$out/nvidia-smi.txt"
# The probe as the worker runs it at start (no cached runner answers).
FLOWMESH_RUNNERS=python3 FLOWMESH_RUNNERS_CACHE=off flowmesh worker --collect-hw >"$out/collect-hw.json"
python3 - "$out/collect-hw.json" <<'PY'
import json, sys
hw = json.load(open(sys.argv[1]))
print(json.dumps({k: hw[k] for k in hw if k != "executors"}, indent=1)[:2000])
print("executors:", json.dumps(hw.get("executors"))[:1500])
PY

python3 -m flowmesh_runners.tiny ./tiny >/dev/null 2>"$out/tiny.log"
port=$(free_port)
export NATS_URL="nats://127.0.0.1:$port"
flowmesh dev --data ./data --workers 0 --no-worker-grace-sec 60 --port "$port" >"$out/dev.log" 2>&1 &
pids+=($!)
FLOWMESH_RUNNERS=python3 FLOWMESH_MODEL_MAP="$dir/tiny/models.json" HF_HUB_OFFLINE=1 WORKER_ID=gpu-real \
  flowmesh worker >"$out/worker.log" 2>&1 &
pids+=($!)
# The runners answer in the background, after importing torch: wait until trl is listed.
wait_sec=300 wait_until "the worker's runners" bash -c "flowmesh worker info gpu-real | grep -q '\"trl\"'"
flowmesh worker list | tee "$out/workers.txt"

cat >gpu.yaml <<'YAML'
apiVersion: flowmesh/v1
kind: Workflow
metadata:
  name: gpu-sft-then-inference
spec:
  resources:
    hardware:
      cpu: 1
      gpu: {count: 1}
  stages:
    - name: train
      spec:
        taskType: lora_sft
        model:
          source: {type: huggingface, identifier: meta-llama/Llama-3.2-1B-Instruct}
        lora: {r: 4, alpha: 8, target_modules: [q_proj, v_proj]}
        data:
          samples:
            - {prompt: "how should i name variables ?", response: "use short descriptive names"}
            - {prompt: "why write tests ?", response: "tests catch regressions early"}
        training: {max_steps: 4, batch_size: 2, learning_rate: 0.001, bf16: true}
        output:
          artifacts: [results.json, final_lora]
    - name: infer
      dependsOn: [train]
      spec:
        taskType: inference
        model:
          source: {type: huggingface, identifier: meta-llama/Llama-3.2-1B-Instruct}
        checkpoint:
          load: {type: local, path: "${train.final_model_archive}"}
        data: {type: list, items: ["why write tests ?"]}
        inference: {max_tokens: 5, min_tokens: 5}
    - name: search
      spec:
        taskType: rag
        embedding: {model: sentence-transformers/all-MiniLM-L6-v2}
        data:
          type: list
          items: ["which gpu ran this ?"]
          documents: ["the worker probes its gpus through nvml", "tests catch regressions early"]
        search: {top_k: 1}
YAML

nvidia-smi --query-compute-apps=timestamp,pid,process_name,used_memory --format=csv -lms 250 \
  >"$out/compute-apps.csv" 2>&1 &
pids+=($!)
start=$(date +%s)
set +e
timeout 600 flowmesh submit gpu.yaml --watch 2>&1 | tee "$out/watch.txt"
code=${PIPESTATUS[0]}
set -e
echo "workflow: exit $code after $(( $(date +%s) - start ))s"
flowmesh task list | tee "$out/tasks.txt"
ok=$code
for stage in train infer search; do
  task=$(grep -oE "wf-[0-9]+-$stage" "$out/tasks.txt" | head -1)
  [ -n "$task" ] || { echo "no task for stage $stage"; ok=1; continue; }
  flowmesh result fetch "$task" --out "./$stage" >/dev/null
  cp "./$stage/results.json" "$out/$stage-results.json"
  device=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("device"))' "./$stage/results.json")
  echo "$stage ($task) ran on: $device"
  case "$device" in cuda*) ;; *) ok=1 ;; esac
done
exit "$ok"
