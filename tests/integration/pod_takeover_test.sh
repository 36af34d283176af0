#!/usr/bin/env bash
# A takeover between two pods of the chart's DaemonSet, played with real
# processes: each dpproxy runs as PID 1 of a PID, network and mount
# namespace of its own (unshare), as a container does, sharing only the
# host's directories with the other; both serve the chart's metrics address
# 0.0.0.0:9464, each in its own network.
#   - The new one serves its probes on its own address, not on the
#     listener the old one hands over (which listens in the old pod's
#     network, where the kubelet's probes of the new pod never arrive).
#   - The new one killed after it took the state and the Allocates were
#     forwarded to it (SIGKILL): the old one, which cannot see the new
#     one's process, sees its lock go and takes the state back at once.
#   - A takeover then completes, and no allocation is lost.
set -uo pipefail

source "${TEST_SRCDIR:-$PWD/..}/dpproxy/tests/integration/lib.sh"

ADDRESS=0.0.0.0:9464
# A dpproxy in a "pod" of its own; $1 names its log. Sets POD (the
# dpproxy's pid as the host sees it).
start_pod() {  # name, dpproxy args...
  local name="$1"; shift
  unshare --pid --net --mount --fork --mount-proc --propagation private \
    sh -c 'ip link set lo up && exec "$@"' sh "$PROXY" "$@" 2>"$R/$name.log" &
  local outer=$!
  PIDS+=($outer)
  # unshare's child: sh, which execs dpproxy.
  wait_until "$name: dpproxy started in its pod" 200 pod_pid "$outer"
  POD="$(pod_pid "$outer")"
  PIDS+=($POD)
}
pod_pid() {  # unshare's pid -> its child's, once that child is dpproxy
  local child
  child="$(cat "/proc/$1/task/$1/children" 2>/dev/null | awk '{print $1}')"
  [[ -n "$child" && "$(readlink "/proc/$child/exe")" == "$(readlink -f "$PROXY")" ]] || return 1
  echo "$child"
}
# GET http://127.0.0.1:9464$2 inside the network namespace of process $1:
# the HTTP status.
status_in() {  # pid, path
  nsenter --net="/proc/$1/ns/net" bash -c '
    exec 3<>/dev/tcp/127.0.0.1/9464 || exit 1
    printf "GET %s HTTP/1.0\r\n\r\n" "$1" >&3
    head -n 1 <&3 | cut -d" " -f2' sh "$2" 2>/dev/null
}
live_in() { [[ "$(status_in "$1" /livez)" == 200 ]]; }
in_log() { grep -q "$2" "$R/$1.log"; }

R="$DIR/node"; mkdir -p "$R"
"$SIM" serve --root-dir="$R/k" --kubelet=1.37 --quiet &
SIMP=$!; PIDS+=($SIMP)
wait_until "kubelet up" 100 test -S "$R/k/kubelet_sim.sock"
COMMON=(--kubelet-root="$R/k" --plugin-dir="$R/p" --state-dir="$R/state"
        --metrics-address="$ADDRESS" --after_handoff=wait)
start_pod old "${COMMON[@]}" --events="$R/old.jsonl"
OLD=$POD
wait_until "old: serves" 200 grep -q proxy_started "$R/old.jsonl"
wait_until "old: its probes answer in its pod" 200 live_in "$OLD"
plugin_and_a_pod "" "$R"

# The new pod dies once it has the state and the Allocates are forwarded
# to it (it stops itself there; then SIGKILL).
DPPROXY_TEST_PAUSE_AT=forwarded start_pod dies "${COMMON[@]}" --takeover \
  --events="$R/dies.jsonl"
DIES=$POD
# (As PID 1 it stops its takeover, not itself.)
wait_until "dies: paused after the forward" 200 in_log dies "PAUSE_AT=forwarded: stopping"
expect_contains "old: the new one's process is hidden from it" "$(cat "$R/old.log")" \
  "in a PID namespace this one cannot see"
kill -KILL "$DIES"
killed_at=$SECONDS
wait_until "old: takes the state back" 600 grep -q handoff_taken_back "$R/old.jsonl"
(( SECONDS - killed_at < 30 )) && pass "old: took it back well before the handoff timeout" \
  || fail "old: took $((SECONDS - killed_at)) s"
grep handoff_taken_back "$R/old.jsonl" | grep -q "let the state directory's lock go" \
  && pass "old: because the lock went" \
  || fail "old: taken back for another reason: $(grep handoff_taken_back "$R/old.jsonl")"
live_in "$OLD" && pass "old: its probes still answer" || fail "old: its probes are silent"
# The new one may have registered before it was killed: the kubelet then
# saw its stream end, as a real one does, until the old one registered again.
expect_exit "old: the kubelet has all four devices again" 0 "$SIM" wait --root_dir="$R/k" \
  --resource=vendor.com/gpu --min_healthy=4 --timeout=10s
expect_exit "a pod after the failed upgrade" 0 "$SIM" allocate --root_dir="$R/k" --pod=p2 \
  --containers=c=vendor.com/gpu:1

# A takeover that completes.
start_pod new "${COMMON[@]}" --takeover --events="$R/new.jsonl"
NEW=$POD
wait_until "new: the takeover completes" 400 grep -q takeover_complete "$R/new.jsonl"
expect_contains "new: binds the address in its own network" "$(cat "$R/new.log")" \
  "is in another network namespace"
wait_until "new: its probes answer in its own pod" 200 live_in "$NEW"
[[ "$(status_in "$NEW" /readyz)" == 200 ]] && pass "new: ready in its own pod" \
  || fail "new: /readyz answers $(status_in "$NEW" /readyz)"
expect_exit "a pod after the upgrade" 0 "$SIM" allocate --root_dir="$R/k" --pod=p3 \
  --containers=c=vendor.com/gpu:1
wait_until "three allocations kept" 200 test "$(allocations "$R/state")" = 3
# The old pod handed over and waits to be deleted (--after_handoff=wait);
# its deletion stops it.
kill -TERM "$OLD"
wait_until "old: exits once deleted" 200 bash -c "! kill -0 $OLD"
expect_exit "a pod after the old one is gone" 0 "$SIM" allocate --root_dir="$R/k" --pod=p4 \
  --containers=c=vendor.com/gpu:1
kill -TERM "$NEW" "$PLUG" "$SIMP"
finish
