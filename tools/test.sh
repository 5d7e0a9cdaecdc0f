#!/usr/bin/env bash
# Runs the test suite: unit tables, example documents, the integration scenarios (each starts its
# own nats-server on a free loopback port) and, alongside them, the README tour. Needs nats-server
# on PATH: ./tools/install-deps.sh installs it. Ends with one line: "tests: N passed, M failed".
# Builds what it runs itself (every binary of the workspace, the Docker test images through the
# ssh tests), so it passes on a fresh clone with nothing built.
#
#   ./tools/test.sh            the suite (a few minutes with the build)
#   ./tools/test.sh --long     the long suite: scenarios that take tens of seconds by design
#                              (outages, kill -9 chaos, idle timeouts, training tiny models), the
#                              ML runners' pytest and the README tour's train-and-serve part.
#                              They are the integration tests marked `#[ignore = "long suite…"]`.
#                              CI runs both.
#
# Other arguments go to `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nats-server >/dev/null || { echo "test: nats-server is not on PATH; run ./tools/install-deps.sh" >&2; exit 1; }
long=no
if [ "${1:-}" = "--long" ]; then
  long=yes
  shift
fi
# The scenarios mostly wait (for processes, timers, the server); more of them at once than there
# are cores keeps the suite short. Set RUST_TEST_THREADS to override.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-6}"
log=$(mktemp)
tour_log=$(mktemp)
trap 'rm -f "$log" "$tour_log"' EXIT
status=0
count() { sed -nE "s/^test result: .* ([0-9]+) $1;.*/\1/p" "$log" | awk '{n += $1} END {print n + 0}'; }

# `cargo test` builds only the binaries of packages with integration tests of their own; the
# suite and the README tour run the standalone services too. (The harness would build them as
# well; building here first keeps that out of the tests' time and the build errors readable.)
if ! cargo build --workspace --locked --bins 2>&1 | tee "$log"; then
  echo "test: the workspace does not build" >&2
  echo "tests: 0 passed, 1 failed"
  exit 1
fi

# The README's commands, run as a newcomer would (tools/readme-tour.sh), beside the cargo tests.
tour_args=()
[ "$long" = yes ] && tour_args=(--ml)
./tools/readme-tour.sh "${tour_args[@]}" >"$tour_log" 2>&1 &
tour=$!

if [ "$long" = yes ]; then
  cargo test --workspace --locked "$@" -- --ignored 2>&1 | tee "$log" || status=$?
else
  cargo test --workspace --locked "$@" 2>&1 | tee "$log" || status=$?
fi
passed=$(count passed)
failed=$(count failed)

if [ "$long" = yes ]; then
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
fi

if wait "$tour"; then
  cat "$tour_log"
  passed=$((passed + 1))
else
  cat "$tour_log"
  echo "test: the README tour failed (output above)" >&2
  failed=$((failed + 1))
  status=1
fi
echo "tests: $passed passed, $failed failed"
exit "$status"
