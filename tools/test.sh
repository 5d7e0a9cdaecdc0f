#!/usr/bin/env bash
# Runs the whole test suite: unit tables, example documents, the integration scenarios (each
# starts its own nats-server on a free loopback port), then the README tour. Needs nats-server
# on PATH: ./tools/install-deps.sh installs it. Ends with one line: "tests: N passed, M failed".
# Builds what it runs itself (every binary of the workspace, the Docker test images through the
# ssh tests), so it passes on a fresh clone with nothing built.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nats-server >/dev/null || { echo "test: nats-server is not on PATH; run ./tools/install-deps.sh" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
built=yes
# `cargo test` builds only the binaries of packages with integration tests of their own; the
# suite and the README tour run the standalone services too. (The harness would build them as
# well; building here first keeps that out of the tests' time and the build errors readable.)
if cargo build --workspace --locked --bins 2>&1 | tee "$log"; then
  cargo test --workspace --locked "$@" 2>&1 | tee "$log" || status=$?
else
  status=1
  built=no
  echo "test: the workspace does not build" >&2
fi
count() { sed -nE "s/^test result: .* ([0-9]+) $1;.*/\1/p" "$log" | awk '{n += $1} END {print n + 0}'; }
passed=$(count passed)
failed=$(count failed)
[ "$built" = yes ] || failed=$((failed + 1))
# The ML runners' own tests (tiny models on CPU), when their dependencies are installed
# (./tools/install-deps.sh --ml); CI installs them. Without them the Rust ML tests skip and say so.
if python3 -c "import torch, transformers, trl, peft, sentence_transformers, pytest" 2>/dev/null; then
  pylog=$(mktemp)
  # (Not `tee /dev/stderr`: where stderr is a file, tee would reopen and truncate it.)
  python3 -m pytest -q -p no:cacheprovider services/flowmesh-runners/tests >"$pylog" 2>&1 || status=1
  cat "$pylog"
  pyout=$(tail -1 "$pylog")
  rm -f "$pylog"
  pycount() { local n; n=$(grep -oE "[0-9]+ $1" <<<"$pyout" | head -1 | grep -oE '^[0-9]+' || true); echo "${n:-0}"; }
  passed=$((passed + $(pycount passed)))
  failed=$((failed + $(pycount failed) + $(pycount error)))
else
  echo "test: ML runner tests skipped: torch/transformers/trl not installed (./tools/install-deps.sh --ml)"
fi
if [ "$status" = 0 ]; then
  # The README's commands, run as a newcomer would (see tools/readme-tour.sh).
  if ./tools/readme-tour.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); status=1; fi
fi
echo "tests: $passed passed, $failed failed"
exit "$status"
