#!/usr/bin/env bash
# Every block the docs mark runnable runs, against the binaries built here
# (tests/docs/runnable_blocks.sh); and the runner reports a failing block
# with its file and line, and never runs an unmarked one (a fixture).
set -uo pipefail
source "$TEST_SRCDIR/dpproxy/tests/testing/checks.sh"
ROOT="$TEST_SRCDIR/dpproxy"
RUN="$ROOT/tests/docs/runnable_blocks.sh"
BINS=("$ROOT/proxy" "$ROOT/tools/dpctl" "$ROOT/tools/conform" "$ROOT/tools/kubelet_sim")
W="$(mktemp -d "${TEST_TMPDIR:-/tmp}/docs.XXXXXX")"

docs=(README.md)
for f in "$ROOT"/docs/*.md; do docs+=("docs/$(basename "$f")"); done
check "every runnable block in the docs runs" bash -c '"$0" "$1" "${@:2}" >"'"$W"'/docs.out" 2>&1' \
  "$RUN" "$ROOT" "${BINS[@]}" -- "${docs[@]}" || cat "$W/docs.out"
check "... and there are some" grep -qE "^[1-9][0-9]* runnable block\(s\), 0 failed" "$W/docs.out"

"$RUN" "$ROOT" "${BINS[@]}" -- tests/docs/testdata/runnable_fails.md >"$W/fixture.out" 2>&1
rc=$?
check "a failing block fails the run" [ "$rc" = 1 ]
check "... naming its file and line" \
  grep -q "the runnable block at tests/docs/testdata/runnable_fails.md:11 failed" "$W/fixture.out"
check "... with its output" grep -q "no_such_flag" "$W/fixture.out"
check "... the others ran, the unmarked one did not" grep -q "^2 runnable block(s), 1 failed" "$W/fixture.out"
finish
