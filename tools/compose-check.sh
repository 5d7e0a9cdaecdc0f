#!/usr/bin/env bash
# Runs compose.yaml for real: builds the image from this checkout, starts the three-node NATS
# cluster and the services, runs workflows through it, stops the NATS meta leader and each router in turn,
# and checks that work still completes. Needs Docker with docker-compose, and `cargo build` done.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export PATH="$repo/target/debug:$PATH"
project=flowmesh-check
compose() { docker-compose -p "$project" -f compose.yaml "$@"; }
finish() {
  local status=$?
  # A failure in CI must be readable from CI's output alone: show what the services said.
  if [ "$status" -ne 0 ]; then
    # Route-reconnect errors to the stopped node repeat every second; leave them out.
    compose logs --no-color --tail 400 2>&1 | grep -v "Error trying to connect to route" | tail -150 >&2 || true
    for port in 8222 8223 8224; do
      echo "--- /jsz on 127.0.0.1:$port" >&2
      python3 -c 'import json, sys, urllib.request
j = json.load(urllib.request.urlopen("http://127.0.0.1:%s/jsz?streams=true" % sys.argv[1], timeout=3))
print(json.dumps({"meta": j.get("meta_cluster"), "streams": [(s["name"], (s.get("cluster") or {}).get("leader")) for a in j.get("account_details") or [] for s in a.get("stream_detail") or []]}))' "$port" >&2 || true
    done
  fi
  compose down -v >/dev/null 2>&1 || true
  exit "$status"
}
trap finish EXIT
./tools/docker-image.sh debug
compose up -d
export NATS_URL="nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224"
# The services' replica count. (This script's polling `worker list` once ran with the old default
# of 1 and created single-replica streams while the cluster could not yet place the services' R3
# ones, and two nodes hosted nothing.) Unset, a client now asks for one replica per server the
# cluster advertises, at most 3: checked below, once the cluster has formed.
export FLOWMESH_REPLICAS=3
for _ in $(seq 120); do
  flowmesh worker list 2>/dev/null | grep -q gpu-sim-1 && flowmesh worker list | grep -q cpu-1 && break
  sleep 1
done
flowmesh worker list
applied=$(env -u FLOWMESH_REPLICAS flowmesh streams apply)
echo "$applied"
grep -qF "(3 replica(s))" <<<"$applied" || { echo "compose-check: the default replica count on this cluster is not 3" >&2; exit 1; }
# Every stream replicated on all three nodes before a node is taken away.
flowmesh streams status --wait 120
run() { echo "+ flowmesh submit $1 --watch"; flowmesh submit "$1" --watch >/dev/null; }
run examples/valid/echo.yaml
run examples/valid/ppo.yaml
# The node to lose is the JetStream meta leader: until the other two elect a new one, no consumer
# can be created anywhere, which is the hardest moment for a client (monitoring port 8222).
# It is lost once the cluster has settled: every server reports healthy, hosts all six streams,
# and the meta leader sees both followers current (a node lost while the cluster still forms is
# another test). `settled`
# prints the meta leader's name when that holds.
settled() {
  python3 - "$@" <<'PY'
import json, sys, urllib.request
ports = {"nats-1": 8222, "nats-2": 8223, "nats-3": 8224}
def get(port, path):
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3))
why = []
try:
    for name, port in ports.items():
        try:
            health = get(port, "/healthz").get("status")
        except Exception as e:  # 503 while not current
            health = str(e)
        if health != "ok":
            why.append(f"{name} /healthz: {health}")
        # Every node hosts a replica of every stream (R3): a node whose meta state lags holds
        # fewer, and losing the meta leader then leaves two nodes that cannot agree.
        streams = get(port, "/jsz").get("streams", 0)
        if streams < 6:
            why.append(f"{name} hosts {streams} streams")
    leader = get(8222, "/jsz")["meta_cluster"]["leader"]
    meta = get(ports[leader], "/jsz")["meta_cluster"]
    lagging = [r["name"] for r in meta.get("replicas", []) if not r["current"]]
    if len(meta.get("replicas", [])) != 2 or lagging:
        why.append(f"meta leader {leader} sees followers {meta.get('replicas')}")
except Exception as e:
    why.append(f"monitoring: {e}")
if not why:
    print(leader)
elif sys.argv[1:] == ["--why"]:
    print("compose-check: not settled: " + "; ".join(why), file=sys.stderr)
sys.exit(0 if not why else 1)
PY
}
lost=""
for _ in $(seq 120); do lost=$(settled) && break; sleep 0.5; done
[ -n "$lost" ] || { settled --why || true; echo "compose-check: the cluster did not settle within 60 s" >&2; exit 1; }
echo "+ stopping $lost (the meta leader)"; compose kill "$lost" >/dev/null 2>&1
run examples/valid/conditional_echo_graph.yaml
flowmesh streams status || true   # two of three replicas: writable, not healthy
echo "+ stopping router-a"; compose kill router-a >/dev/null 2>&1
run examples/valid/echo.yaml
echo "+ restarting router-a, stopping router-b"; compose start router-a >/dev/null 2>&1; compose kill router-b >/dev/null 2>&1
run examples/valid/echo.yaml
echo "compose-check: the cluster ran every workflow, through the loss of its meta leader ($lost) and of both routers"
