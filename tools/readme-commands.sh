#!/usr/bin/env bash
# Prints the README's two opening commands, one a line: the first runs the stack and a demo
# workflow, the second the tests. They are the first two lines of README.md's first ```sh block,
# without their trailing comments. CI runs what this prints, so the README cannot drift from CI.
# With an argument (1 or 2) it prints only that command.
set -euo pipefail
cd "$(dirname "$0")/.."
commands=$(awk '/^```sh$/ {inside = 1; next} inside && /^```$/ {exit} inside' README.md |
  sed -E 's/[[:space:]]+#.*$//' | sed -E '/^[[:space:]]*$/d')
[ "$(printf '%s\n' "$commands" | wc -l)" -eq 2 ] || {
  echo "readme-commands: README.md's first sh block must hold exactly two commands, found:" >&2
  printf '%s\n' "$commands" >&2
  exit 1
}
case "${1:-all}" in
  all) printf '%s\n' "$commands" ;;
  1 | 2) printf '%s\n' "$commands" | sed -n "${1}p" ;;
  *) echo "readme-commands: expected 1 or 2, got $1" >&2; exit 2 ;;
esac
