#!/usr/bin/env bash
# tests/docs/runnable_blocks.sh ROOT BIN_DIR... -- FILE...: runs every code
# block the docs mark runnable (a fence whose info string is `sh runnable`)
# and prints, for each block that fails, the file, its line and the
# output. A block runs under `bash -euo pipefail` in a scratch directory
# where the repository's files are found as in a checkout (ROOT's top
# folders, and bazel-bin/ pointing at ROOT), with each BIN_DIR on PATH. Its
# `bazel build` lines are already done (the caller built what they name)
# and are skipped. Exits 1 if a block failed or no file has one, 0 if
# every block ran.
#
#   tests/docs/runnable_blocks.sh "$ROOT" "$ROOT/proxy" -- README.md docs/*.md
set -uo pipefail

root="$1"; shift
bins=()
while [[ $# -gt 0 && "$1" != "--" ]]; do bins+=("$1"); shift; done
shift || true
scratch="$(mktemp -d "${TEST_TMPDIR:-/tmp}/runnable.XXXXXX")"
for top in "$root"/*; do ln -s "$top" "$scratch/$(basename "$top")"; done
ln -s "$root" "$scratch/bazel-bin"
path="$(IFS=:; echo "${bins[*]}"):$PATH"

blocks=0 failed=0
for f in "$@"; do
  # One block per file: its first line number, then its lines.
  awk -v file="$f" '
    /^```sh runnable[ \t]*$/ { on = 1; n++; start = NR; printf "%s\n", "#@block " file ":" start; next }
    on && /^```/ { on = 0; next }
    on { print }
  ' "$root/$f" >"$scratch/.blocks"
  while IFS= read -r header; do
    where="${header#\#@block }"
    awk -v h="$header" '$0 == h {on = 1; next} /^#@block / {on = 0} on' "$scratch/.blocks" |
      grep -vE '^[[:space:]]*bazel build ' >"$scratch/.block.sh"
    blocks=$((blocks + 1))
    if ! out="$(cd "$scratch" && PATH="$path" bash -euo pipefail "$scratch/.block.sh" 2>&1)"; then
      failed=$((failed + 1))
      echo "the runnable block at $where failed:"
      sed 's/^/  | /' "$scratch/.block.sh"
      echo "  output:"
      printf '%s\n' "$out" | tail -n 20 | sed 's/^/  > /'
    fi
  done < <(grep '^#@block ' "$scratch/.blocks")
done
rm -rf "$scratch"
if [[ $blocks -eq 0 ]]; then
  echo "no runnable block in: $*"
  exit 1
fi
echo "$blocks runnable block(s), $failed failed"
[[ $failed -eq 0 ]]
