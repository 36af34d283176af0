# tests/testing/checks.sh: sourced by shell tests. Counts named checks and
# ends with "N passed, N failed" (exit status 1 if any failed).
#
#   source "$TEST_SRCDIR/dpproxy/tests/testing/checks.sh"
#   check "unit 0644" [ "$(stat -c %a unit)" = 644 ] || finish   # stop here if it failed
#   finish

PASSED=0
FAILED=0
ok() { echo "ok: $1"; PASSED=$((PASSED + 1)); }
fail() { echo "FAIL: $1"; FAILED=$((FAILED + 1)); }
check() {  # name, command...: the command's success, reported
  local name="$1"; shift
  if "$@"; then ok "$name"; return 0; fi
  fail "$name"; return 1
}
finish() {
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" -eq 0 ]
  exit $?
}
