#!/usr/bin/env bash
# Upgrades beside a running dpproxy (--takeover) with real processes, as
# the documented upgrade runs them, both on one metrics address:
#   - the new dpproxy killed (SIGKILL) right after each step of the handoff
#     (it stops itself there: DPPROXY_TEST_PAUSE_AT, docs/testing.md),
#     the last once it is registered with the kubelet;
#   - a new dpproxy that never registers, stopped with SIGTERM;
#   - then a takeover that completes;
#   - the running dpproxy killed while it hands over: the new one starts;
#   - a takeover during which /livez and /readyz are probed without pause.
# Throughout, one dpproxy serves: the kubelet keeps every device, the
# metrics address answers, the Allocate sent meanwhile is answered, and no
# allocation is lost.
set -uo pipefail

source "${TEST_SRCDIR:-$PWD/..}/dpproxy/tests/integration/lib.sh"

# Whether process $1 is stopped (SIGSTOP).
stopped() { [[ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" == "T" ]]; }
# The HTTP status of GET http://127.0.0.1:$1$2 (bash's /dev/tcp: no client
# to install).
http_status() {  # port, path
  local reply
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.0\r\n\r\n' "$2" >&3
  reply="$(head -n 1 <&3)"
  exec 3<&- 3>&-
  printf '%s' "$reply" | cut -d' ' -f2
}
probe_ok() { [[ "$(http_status "$1" /livez)" == "200" ]]; }

# One node: a kubelet, the running dpproxy on 127.0.0.1:0, four devices,
# one pod. Sets R, SIMP, OLD, PLUG, PORT.
start_node() {  # name [kubelet release, 1.31 by default]
  R="$DIR/$1"; mkdir -p "$R"
  "$SIM" serve --root-dir="$R/k" --kubelet="${2:-1.31}" --quiet &
  SIMP=$!; PIDS+=($SIMP)
  wait_until "$1: kubelet up" 100 test -S "$R/k/kubelet_sim.sock"
  "$PROXY" --kubelet-root="$R/k" --plugin-dir="$R/p" --state-dir="$R/state" \
    --metrics-address=127.0.0.1:0 --events="$R/old.jsonl" 2>"$R/old.log" &
  OLD=$!; PIDS+=($OLD)
  wait_until "$1: dpproxy up" 100 grep -q proxy_started "$R/old.jsonl"
  PORT="$(grep -o 'metrics at http://127.0.0.1:[0-9]*' "$R/old.log" | grep -o '[0-9]*$')"
  plugin_and_a_pod "$1: " "$R"
}

# After the new dpproxy is gone: the old one took the state back, serves
# the kubelet and the metrics address, and a full takeover then works.
# `registered`: whether the new one may have registered with the kubelet
# before it was killed (then the kubelet saw its stream end, as a real one
# does, until the old one registered again).
check_old_serves_on() {  # name, allocations expected, registered
  wait_until "$1: the old dpproxy took the state back" 200 grep -q handoff_taken_back "$R/old.jsonl"
  kill -0 "$OLD" 2>/dev/null && pass "$1: the old dpproxy still runs" || fail "$1: the old one exited"
  probe_ok "$PORT" && pass "$1: the metrics address answers" || fail "$1: port $PORT is silent"
  expect_exit "$1: the kubelet has all four devices" 0 "$SIM" wait --root_dir="$R/k" \
    --resource=vendor.com/gpu --min_healthy=4 --timeout=10s
  expect_exit "$1: a pod after" 0 "$SIM" allocate --root_dir="$R/k" --pod=p9 \
    --containers=c=vendor.com/gpu:1
  wait_until "$1: $(($2 + 1)) allocations kept" 200 test "$(allocations "$R/state")" = "$(($2 + 1))"
  if [[ $3 == no ]]; then
    grep -q '"event":"plugin_lost"' "$R/k/kubelet_sim.events.jsonl" \
      && fail "$1: the kubelet lost the resource" || pass "$1: the kubelet never lost the resource"
  fi
  # A takeover that completes, on the same address.
  "$PROXY" --takeover --kubelet-root="$R/k" --plugin-dir="$R/p" --state-dir="$R/state" \
    --metrics-address=127.0.0.1:0 --events="$R/last.jsonl" 2>"$R/last.log" &
  local last=$!; PIDS+=($last)
  wait_until "$1: a later takeover completes" 200 grep -q takeover_complete "$R/last.jsonl"
  wait "$OLD"; local rc=$?
  [[ $rc -eq 0 ]] && pass "$1: the old one exits 0 once handed over" || fail "$1: old exit $rc"
  expect_contains "$1: the new one serves the old one's listener" "$(cat "$R/last.log")" \
    "serving the metrics address on the listener the running dpproxy handed over"
  probe_ok "$PORT" && pass "$1: the same address answers after" || fail "$1: port $PORT is silent"
  kill -TERM "$last" "$PLUG" "$SIMP"; wait "$last" "$PLUG" "$SIMP"
}

# Killed right after each step. After "registered" the kubelet's client for
# the resource is the new one's (a 1.31 kubelet's, by name), and its exit
# leaves the resource without one: the old one, whose socket the kubelet
# still streams from, sees the kubelet list none of its devices and
# registers again. A 1.37 kubelet keeps a client per socket and makes the
# old one's the resource's again: nothing is registered twice there (it
# would refuse it, "already connected"). (After "forwarded" the new one
# may or may not have registered yet.)
for step in released forwarded registered registered-1.37; do
  kubelet=1.31
  [[ $step == *-1.37 ]] && kubelet=1.37
  start_node "$step" "$kubelet"
  DPPROXY_TEST_PAUSE_AT=${step%-1.37} "$PROXY" --takeover --kubelet-root="$R/k" --plugin-dir="$R/p" \
    --state-dir="$R/state" --metrics-address=127.0.0.1:0 --events="$R/new.jsonl" \
    2>"$R/new.log" &
  NEW=$!; PIDS+=($NEW)
  wait_until "$step: the new dpproxy stopped after it" 200 stopped "$NEW"
  probe_ok "$PORT" && pass "$step: the address answers meanwhile" || fail "$step: port $PORT is silent"
  want=1
  if [[ $step == released ]]; then
    # Held by the old one, which can write nothing until it has the state
    # back.
    "$SIM" allocate --root_dir="$R/k" --pod=p2 --containers=c=vendor.com/gpu:1 \
      >"$R/held.out" 2>&1 &
    HELD=$!
    want=2
  fi
  kill -KILL "$NEW"; wait "$NEW" 2>/dev/null
  if [[ $step == released ]]; then
    wait "$HELD"; rc=$?
    [[ $rc -eq 0 ]] && pass "$step: the held Allocate is answered" \
      || fail "$step: held Allocate exit $rc: $(cat "$R/held.out")"
  fi
  check_old_serves_on "$step" "$want" "$([[ $step == released ]] && echo no || echo maybe)"
  refused="$(grep -h 'already connected' "$R/k/"*.jsonl 2>/dev/null | head -n 1)"
  [[ -z "$refused" ]] && pass "$step: the kubelet refused no registration" \
    || fail "$step: the kubelet refused one: $refused"
done

# A new dpproxy that never registers (its kubelet root has no kubelet),
# stopped by its operator: it hands the state back before it exits.
start_node unregistered
mkdir -p "$R/nokubelet"
"$PROXY" --takeover --kubelet-root="$R/nokubelet" --plugin-dir="$R/p" --state-dir="$R/state" \
  --metrics-address=127.0.0.1:0 --events="$R/new.jsonl" 2>"$R/new.log" &
NEW=$!; PIDS+=($NEW)
wait_until "unregistered: it took the state" 200 grep -q takeover_released "$R/new.jsonl"
kill -TERM "$NEW"; wait "$NEW"
expect_contains "unregistered: it says it handed the state back" "$(cat "$R/new.log")" \
  "the state was handed back and the running dpproxy serves on"
check_old_serves_on unregistered 1 no

# The running dpproxy dies in the middle of the handoff (SIGKILL while it
# releases the state, before it answers): the new one finds the lock free
# and starts as after a crash, so the node is never left without one.
R="$DIR/dies"; mkdir -p "$R"
"$SIM" serve --root-dir="$R/k" --kubelet=1.31 --quiet &
SIMP=$!; PIDS+=($SIMP)
wait_until "dies: kubelet up" 100 test -S "$R/k/kubelet_sim.sock"
DPPROXY_TEST_DIE_AT=release "$PROXY" --kubelet-root="$R/k" --plugin-dir="$R/p" \
  --state-dir="$R/state" --metrics-address=127.0.0.1:0 --events="$R/old.jsonl" 2>"$R/old.log" &
OLD=$!; PIDS+=($OLD)
wait_until "dies: dpproxy up" 100 grep -q proxy_started "$R/old.jsonl"
"$PLUGIN" --resource=vendor.com/gpu --devices=4 --kubelet-socket="$R/p/kubelet.sock" --quiet &
PLUG=$!; PIDS+=($PLUG)
expect_exit "dies: four devices" 0 "$SIM" wait --root_dir="$R/k" --resource=vendor.com/gpu \
  --min_healthy=4 --timeout=10s
expect_exit "dies: a pod before" 0 "$SIM" allocate --root_dir="$R/k" --pod=p1 \
  --containers=c=vendor.com/gpu:1
"$PROXY" --takeover --kubelet-root="$R/k" --plugin-dir="$R/p" --state-dir="$R/state" \
  --metrics-address=127.0.0.1:0 --events="$R/new.jsonl" 2>"$R/new.log" &
NEW=$!; PIDS+=($NEW)
wait "$OLD"; rc=$?
[[ $rc -eq 137 ]] && pass "dies: the old one was killed during the handoff" \
  || fail "dies: old exit $rc"
wait_until "dies: the new one starts as after a crash" 200 grep -q proxy_started "$R/new.jsonl"
grep -q '"event":"takeover_predecessor_gone"' "$R/new.jsonl" \
  && pass "dies: it says the running one was gone" || fail "dies: no takeover_predecessor_gone"
kill -0 "$NEW" 2>/dev/null && pass "dies: the new one runs" || fail "dies: the new one exited"
expect_exit "dies: the kubelet has all four devices" 0 "$SIM" wait --root_dir="$R/k" \
  --resource=vendor.com/gpu --min_healthy=4 --timeout=20s
expect_exit "dies: a pod after" 0 "$SIM" allocate --root_dir="$R/k" --pod=p2 \
  --containers=c=vendor.com/gpu:1
wait_until "dies: both allocations kept" 200 test "$(allocations "$R/state")" = 2
kill -TERM "$NEW" "$PLUG" "$SIMP"; wait "$NEW" "$PLUG" "$SIMP"

# Probes answered throughout a takeover that completes: /livez and /readyz
# are asked again and again on the shared address, from before the new
# dpproxy starts until the old one has exited, and every answer is 200,
# from whichever process takes the connection.
start_node probes
ready_at() { [[ "$(http_status "$1" /readyz)" == 200 ]]; }
wait_until "probes: ready before" 200 ready_at "$PORT"
: >"$R/probes.txt"
(
  while [[ ! -e "$R/probes.stop" ]]; do
    for path in /livez /readyz; do
      printf '%s %s\n' "$path" "$(http_status "$PORT" "$path")" >>"$R/probes.txt"
    done
  done
) &
PROBER=$!
"$PROXY" --takeover --kubelet-root="$R/k" --plugin-dir="$R/p" --state-dir="$R/state" \
  --metrics-address=127.0.0.1:0 --events="$R/new.jsonl" 2>"$R/new.log" &
NEW=$!; PIDS+=($NEW)
wait_until "probes: the takeover completes" 300 grep -q takeover_complete "$R/new.jsonl"
wait "$OLD"
# A few more rounds against the new one alone.
n="$(wc -l <"$R/probes.txt")"
at_least() { [[ "$(wc -l <"$1")" -ge "$2" ]]; }  # file, lines
wait_until "probes: answered by the new one alone" 200 at_least "$R/probes.txt" "$((n + 20))"
touch "$R/probes.stop"; wait "$PROBER"
total="$(wc -l <"$R/probes.txt")"
bad="$(grep -vc ' 200$' "$R/probes.txt")"
[[ $bad -eq 0 && $total -ge 40 ]] && pass "probes: $total answers, all 200" \
  || fail "probes: $bad of $total answers were not 200: $(grep -v ' 200$' "$R/probes.txt" | sort | uniq -c | tr '\n' ';')"
expect_contains "probes: the new one answered once it was ready" "$(cat "$R/new.log")" \
  "answering on the shared HTTP listener from now on"
kill -TERM "$NEW" "$PLUG" "$SIMP"; wait "$NEW" "$PLUG" "$SIMP"

finish
