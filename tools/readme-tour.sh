#!/usr/bin/env bash
# Runs the README's tour and command list against a private local stack, so the README cannot
# rot: first it checks that every `flowmesh …` line in the README's sh blocks appears below
# (workflow ids normalised), then it runs them and checks their outcomes. The tiny train-and-serve
# part runs only with `--ml` (the long suite: ./tools/test.sh --long) and the ML runners installed.
set -euo pipefail
ml=no
case "${1:-}" in
  --ml) ml=yes ;;
  "") ;;
  *) echo "usage: readme-tour.sh [--ml]" >&2; exit 2 ;;
esac
repo=$(cd "$(dirname "$0")/.." && pwd)
bin="$repo/target/debug"
[ -x "$bin/flowmesh" ] || { echo "readme-tour: build first (cargo build)" >&2; exit 1; }
export PATH="$bin:$PATH"
self="$repo/tools/readme-tour.sh"

# 1. Every README command is exercised here.
# Ids differ between runs: `wf-7` in the README and "$first" or "$ppo-main" here both read wf-N.
normalise() { sed -E 's/wf-[0-9]+/wf-N/g; s/"\$[a-z_]+(-[a-z]+)?"/wf-N\1/g; s/[[:space:]]+#.*$//; s/[[:space:]]+$//'; }
missing=0
exercised=$(normalise <"$self")
while IFS= read -r line; do
  command=$(printf '%s\n' "$line" | normalise)
  if ! grep -qF -- "$command" <<<"$exercised"; then
    echo "readme-tour: the README command is not exercised: $command" >&2
    missing=1
  fi
done < <(awk '/^```sh/{on=1; next} /^```/{on=0} on' "$repo/README.md" | grep -E '^([A-Z_]+=[^ ]+ )*flowmesh ' || true)
[ "$missing" = 0 ] || exit 1

# 2. The tour, in a scratch folder that sees the examples.
work=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
ln -s "$repo/examples" examples
export NATS_URL="nats://127.0.0.1:$port"
expect() { # expect CODE COMMAND...: runs it, fails the tour on another exit code
  local want=$1; shift
  echo "+ $*" >&2
  set +e; "$@"; local got=$?; set -e
  [ "$got" = "$want" ] || { echo "readme-tour: '$*' exited $got, expected $want" >&2; exit 1; }
}
wait_for() { # wait_for DESCRIPTION COMMAND...: polls for up to 60 s
  local what=$1; shift
  for _ in $(seq 300); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "readme-tour: timed out waiting for $what" >&2; exit 1
}
id_of() { sed -nE 's/^submitted (wf-[0-9]+) .*/\1/p' "$1" | tail -1; }

flowmesh dev --data ./flowmesh-data --no-worker-grace-sec 10 --port "$port" >dev.log 2>&1 &
pids+=($!)
wait_for "the dev worker" sh -c 'flowmesh worker list | grep -q dev-worker-1'

expect 0 flowmesh worker list
expect 0 flowmesh submit examples/valid/conditional_echo_graph.yaml --watch 2>submit1.log
first=$(id_of submit1.log)
expect 0 flowmesh workflow list
expect 0 flowmesh events --workflow "$first"

expect 1 flowmesh plan examples/valid/ppo.yaml
expect 1 flowmesh submit examples/valid/ppo.yaml --watch 2>ppo1.log
grep -q 'no_eligible_worker' ppo1.log || { cat ppo1.log; echo "readme-tour: the PPO stage did not fail with no_eligible_worker" >&2; exit 1; }
FLOWMESH_RUNNERS=off FLOWMESH_SIMULATE_HW="$(cat examples/hardware/gpu-h100.json)" FLOWMESH_EXECUTORS=examples/executors/demo-trainer.toml WORKER_ID=gpu-sim-1 flowmesh worker >gpu.log 2>&1 &
pids+=($!)
wait_for "the simulated GPU worker" sh -c 'flowmesh worker list | grep -q gpu-sim-1'
expect 0 flowmesh plan examples/valid/ppo.yaml
expect 0 flowmesh submit examples/valid/ppo.yaml --watch 2>ppo2.log
ppo=$(id_of ppo2.log)
expect 0 flowmesh result fetch "$ppo-main" --out ./out
[ -s out/results.json ] && [ -s out/artifacts/checkpoints/model.txt ] || { echo "readme-tour: result fetch wrote no files" >&2; exit 1; }

# "Train and serve a tiny model for real", with --ml and the ML runners installed
# (./tools/install-deps.sh --ml; CI installs them and runs the long suite).
if [ "$ml" = no ]; then
  echo "readme-tour: the tiny train and serve runs in the long suite (./tools/test.sh --long)"
elif python3 -c "import flowmesh_runners, torch, transformers, peft, trl, datasets" 2>/dev/null; then
  python3 -m flowmesh_runners.tiny ./tiny-models >/dev/null 2>tiny-build.log
  FLOWMESH_MODEL_MAP=$PWD/tiny-models/models.json WORKER_ID=ml-1 flowmesh worker >ml.log 2>&1 &
  pids+=($!)
  # Runners are on by default; the worker asks them in the background (importing torch and TRL
  # is slow) and lists them as initialising until they answer: give it longer than a minute.
  for _ in $(seq 900); do flowmesh worker info ml-1 2>/dev/null | grep -q '"trl"' && break; sleep 0.2; done
  expect 0 flowmesh worker info ml-1 >ml-info.json
  grep -q '"trl"' ml-info.json && grep -q 'unavailable' ml-info.json || { cat ml-info.json; echo "readme-tour: ml-1 does not list its runners" >&2; exit 1; }
  expect 0 flowmesh submit examples/valid/tiny_sft_then_inference.yaml --watch 2>tiny.log
  tiny=$(id_of tiny.log)
  expect 0 flowmesh task logs "$tiny-train" --follow --stderr >tiny-train.log
  expect 0 flowmesh events --workflow "$tiny" >tiny-events.log
  grep -q 'loss' tiny-events.log && grep -q 'tokens/s' tiny-events.log || { cat tiny-events.log; echo "readme-tour: no training or inference progress" >&2; exit 1; }
  expect 0 flowmesh result fetch "$tiny-train" --out ./out
  [ -s out/final_lora/adapter_model.safetensors ] || { echo "readme-tour: no adapter was fetched" >&2; exit 1; }
else
  echo "readme-tour: the ML runners are not installed; skipping the tiny train and serve (./tools/install-deps.sh --ml)"
fi

expect 0 flowmesh submit - --watch < examples/valid/echo.yaml
expect 0 flowmesh submit examples/valid/echo.yaml --msg-id run-7
expect 0 flowmesh validate examples/valid/*.yaml
expect 0 flowmesh submit examples/valid/python_command.yaml --watch 2>python.log
python_wf=$(id_of python.log)
expect 0 flowmesh task logs "$python_wf-main"
expect 0 flowmesh task list --workflow "$first"
expect 0 flowmesh workflow info "$first"
expect 0 flowmesh workflow cancel "$python_wf"
expect 0 flowmesh worker info dev-worker-1
expect 0 flowmesh worker cordon dev-worker-1
expect 0 flowmesh worker uncordon dev-worker-1
expect 0 flowmesh task info "$python_wf-main"
expect 0 flowmesh task watch "$python_wf-main"
expect 1 flowmesh task stop "$python_wf-main"      # it has already ended
expect 0 flowmesh workflow submit examples/valid/echo.yaml --watch
expect 0 flowmesh workflow validate examples/valid/*.yaml
expect 0 flowmesh workflow logs "$python_wf"
expect 0 flowmesh result download "$python_wf-main" --include all -o bundle.tgz
tar -tzf bundle.tgz | grep -q "results.json" || { echo "readme-tour: the bundle has no results.json" >&2; exit 1; }
expect 0 flowmesh trace "$first" --svg "$first".svg
grep -q "<svg" "$first".svg || { echo "readme-tour: trace wrote no picture" >&2; exit 1; }
expect 0 flowmesh worker drain dev-worker-1
expect 0 flowmesh worker uncordon dev-worker-1
expect 0 flowmesh validate examples/n8n/sft_then_inference.json
expect 1 flowmesh validate examples/n8n/unsupported_openai.json
expect 0 flowmesh streams apply
expect 0 flowmesh streams prune-artifacts
expect 0 flowmesh bench --dev --tasks 300 --concurrency 32 --raw
expect 0 flowmesh bench --dev --tasks 300 --mix echo=1 --sweep
flowmesh completions bash > flowmesh.bash
[ -s flowmesh.bash ] || { echo "readme-tour: no completion script" >&2; exit 1; }
expect 1 flowmesh validate examples/invalid/several_errors.yaml
echo "readme-tour: every README command ran as documented"
