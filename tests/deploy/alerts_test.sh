#!/usr/bin/env bash
# The shipped alerting rules (deploy/prometheus-alerts.yaml): valid rules,
# and their unit tests (alerts_test.yaml: the kubelet away, the plugin
# away, unhealthy devices, failed state writes, an unreachable API server)
# pass under promtool (Debian's prometheus package).
set -uo pipefail
source "$TEST_SRCDIR/dpproxy/tests/testing/checks.sh"
SRC="$TEST_SRCDIR/dpproxy"
W="$(mktemp -d "${TEST_TMPDIR:-/tmp}/alerts.XXXXXX")"

check "promtool is installed (Debian's prometheus package)" command -v promtool || finish
check "the rules are valid" promtool check rules "$SRC/deploy/prometheus-alerts.yaml"
# The test file names the rules by their path in the repository.
mkdir -p "$W/deploy" "$W/tests/deploy"
cp "$SRC/deploy/prometheus-alerts.yaml" "$W/deploy/"
cp "$SRC/tests/deploy/alerts_test.yaml" "$W/tests/deploy/"
check "their unit tests pass" promtool test rules "$W/tests/deploy/alerts_test.yaml"
# The unit tests can fail: with every alert's `for` gone, the ones that
# must wait fire too early.
sed 's/^\(\s*\)for: .*/\1for: 0m/' "$SRC/deploy/prometheus-alerts.yaml" >"$W/deploy/prometheus-alerts.yaml"
check "... and fail when an alert fires too early" bash -c "! promtool test rules '$W/tests/deploy/alerts_test.yaml' >/dev/null 2>&1"
finish
