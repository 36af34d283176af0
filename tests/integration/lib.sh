# Shared by the shell tests of the shipped binaries: where they are, a
# scratch directory, and checks on processes and their output, on top of
# tests/testing/checks.sh (each prints "ok: ..." or "FAIL: ..."). Source
# it; the test ends with `finish`.

RUNFILES="${TEST_SRCDIR:-$PWD/..}/dpproxy"
SIM="$RUNFILES/tools/kubelet_sim/kubelet_sim"
PLUGIN="$RUNFILES/tools/sample_plugin/sample_plugin"
PROXY="$RUNFILES/proxy/dpproxy"
DPCTL="$RUNFILES/tools/dpctl/dpctl"
DIR="$(mktemp -d /tmp/dpp.XXXXXX)"
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$DIR"
}
trap cleanup EXIT

source "$RUNFILES/tests/testing/checks.sh"
pass() { ok "$*"; }
# The end of a process's log for a failure message: a sanitizer's whole
# report if there is one, else the last 30 lines.
log_end() {  # file
  if grep -q "^==[0-9]*==ERROR: " "$1" 2>/dev/null; then
    sed -n '/^==[0-9]*==ERROR: /,$p' "$1" | head -n 200
  else
    tail -n 30 "$1"
  fi
}
expect_contains() {  # name, haystack, needle
  if [[ "$2" == *"$3"* ]]; then pass "$1"; else fail "$1: expected to find [$3] in: $2"; fi
}
# The simulator's state shows `allocatable` for the one resource.
sim_allocatable() {  # root, count
  "$SIM" state --root_dir="$1" --output=json | grep -q "\"allocatable\": \"$2\""
}
# The sample plugin of vendor.com/gpu (four devices) behind the dpproxy
# whose node directory is $2 (kubelet root $2/k, plugin directory $2/p),
# the kubelet seeing all four, and pod p1 of one device. Sets PLUG.
plugin_and_a_pod() {  # check name prefix, node directory
  "$PLUGIN" --resource=vendor.com/gpu --devices=4 --kubelet-socket="$2/p/kubelet.sock" --quiet &
  PLUG=$!; PIDS+=($PLUG)
  expect_exit "$1four devices through dpproxy" 0 "$SIM" wait --root_dir="$2/k" \
    --resource=vendor.com/gpu --min_healthy=4 --timeout=10s
  expect_exit "$1a pod before the upgrade" 0 "$SIM" allocate --root_dir="$2/k" --pod=p1 \
    --uid=p1 --containers=c=vendor.com/gpu:1
}
# How many allocations the status file of state directory $1 shows.
allocations() {  # state dir
  "$PROXY" status --state_dir="$1" --output=json 2>/dev/null | grep -o '"allocations": *[0-9]*' |
    grep -o '[0-9]*$'
}
# Polls `command` every 50 ms until it succeeds (pass) or `tries` run out
# (fail): a deadline, never a bare wait.
wait_until() {  # name, tries, command...
  local name="$1" tries="$2"; shift 2
  for _ in $(seq "$tries"); do
    if "$@" 2>/dev/null; then pass "$name"; return 0; fi
    sleep 0.05
  done
  fail "$name: not within $((tries / 20)) s"
  return 1
}
# Starts the API-server simulator with `args` (it serves on a free port),
# waits for it, and writes a kubeconfig for it to $DIR/kubeconfig whose
# user carries `token`. Sets API_URL.
start_apiserver() {  # token, args...
  local token="$1"; shift
  "$RUNFILES/tools/apiserver_sim/apiserver_sim" --listen=127.0.0.1:0 --token="$token" \
    --nodes=node-1=v1.36.2 "$@" \
    >"$DIR/api.out" 2>&1 &
  PIDS+=($!)
  wait_until "the API server serves" 200 grep -q serving "$DIR/api.out"
  API_URL="$(sed -n 's/^apiserver_sim: serving //p' "$DIR/api.out")"
  cat >"$DIR/kubeconfig" <<KC
current-context: node
contexts: [{name: node, context: {cluster: sim, user: dpproxy}}]
clusters: [{name: sim, cluster: {server: "$API_URL"}}]
users: [{name: dpproxy, user: {token: $token}}]
KC
}
expect_exit() {  # name, expected code, command...
  local name="$1" want="$2"; shift 2
  local out; out="$("$@" 2>&1)"; local got=$?
  if [[ $got -eq $want ]]; then pass "$name (exit $got)"; else fail "$name: exit $got, want $want: $out"; fi
  LAST_OUT="$out"
}

