# Sourced by the bench scripts, gpu-check.sh and ml-examples.sh: a scratch folder and the processes started in
# it, all removed on exit; a free loopback port; waiting for a step with a deadline (never a fixed
# sleep).
#
#   source "$(dirname "$0")/scratch.sh"; scratch_start bench-processes
#   port=$(free_port); some-server --port "$port" & pids+=($!)
#   wait_until "some-server" some-check --port "$port"

scratch_start() {
  scratch_name=$1
  dir=$(mktemp -d)
  pids=()
  trap scratch_stop EXIT
}

scratch_stop() {
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$dir"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_until WHAT COMMAND…: runs COMMAND every 0.1 s until it succeeds, for at most $wait_sec
# seconds (30 unless set).
wait_until() {
  local what=$1 limit=${wait_sec:-30}
  shift
  for _ in $(seq $((limit * 10))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "$scratch_name: $what did not come up within $limit s (logs in $dir)" >&2
  exit 1
}
