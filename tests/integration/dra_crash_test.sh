#!/usr/bin/env bash
# DRA claims in dpproxy's journal, with real processes: a simulated API
# server and 1.36 kubelet, a sample plugin whose every Allocate takes 1 s,
# and dpproxy in DRA mode, killed with SIGKILL twice:
#  - after a claim was prepared: the claim is in the journal (dpctl), the
#    kubelet's next prepare is answered the same without the plugin, and
#    unprepare releases it;
#  - in the middle of a prepare (the plugin's Allocate under way): that
#    claim is at most reserved in the journal (its devices held while the
#    plugin is called, never answered); the next start releases it, and
#    the kubelet's next prepare succeeds.
source "$(dirname "$0")/lib.sh"
API="$RUNFILES/tools/apiserver_sim/apiserver_sim"
ROOT="$DIR/kubelet"
PLUGINS="$DIR/dpproxy/device-plugins"
STATE="$DIR/dpproxy"
DRIVER=gpu.example.com

start_apiserver node-token
URL="$API_URL"
"$SIM" serve --root_dir="$ROOT" --kubelet=1.36 --kubeconfig="$DIR/kubeconfig" \
  --node_name=node-1 --cdi_dirs="$DIR/cdi" --quiet &
PIDS+=($!)
wait_until "the kubelet serves" 200 test -S "$ROOT/device-plugins/kubelet.sock"

start_proxy() {
  "$PROXY" --kubelet_api=dra --dra_driver="$DRIVER" --node_name=node-1 \
    --kubeconfig="$DIR/kubeconfig" --cdi_dir="$DIR/cdi" --kubelet_root="$ROOT" \
    --plugin_dir="$PLUGINS" --state_dir="$STATE" --status_file="$DIR/status.json" \
    --events="$DIR/proxy.jsonl" --metrics_address= 2>>"$DIR/proxy.log" &
  PROXY_PID=$!
  PIDS+=("$PROXY_PID")
}
count() { grep -c "$1" "$2" 2>/dev/null || true; }
# dpproxy's start number N is serving: the plugin is back with it and the
# kubelet registered the driver again.
serving() {  # n
  [[ "$(count '"backend_up"' "$DIR/proxy.jsonl")" -ge "$1" &&
     "$(count dra_driver_registered "$ROOT/kubelet_sim.events.jsonl")" -ge "$1" ]]
}
allocates() { count ': allocate container_requests' "$DIR/plugin.out"; }
allocated_at_least() { [[ "$(allocates)" -ge "$1" ]]; }
prepare() { "$SIM" prepare --root_dir="$ROOT" --driver="$DRIVER" --claims="$1" 2>&1; }

start_proxy
wait_until "dpproxy serves the plugins" 200 test -S "$PLUGINS/kubelet.sock"
"$PLUGIN" --api=v1beta1 --resource=example.com/gpu --devices=4 --id_pattern='gpu-{i}' \
  --allocate_delay=1s --kubelet_socket="$PLUGINS/kubelet.sock" >"$DIR/plugin.out" 2>&1 &
PIDS+=($!)
wait_until "the driver is registered and the pool published" 400 serving 1
wait_until "the pool is in the API server" 200 grep -q dra_pool_published "$DIR/proxy.jsonl"
check "dpproxy loaded its HTTPS module for the API server" \
  grep -q "/dpproxy-https.so$" "/proc/$PROXY_PID/maps"

# A claim prepared, then dpproxy killed.
CLAIM_A="$("$API" claim --server="$URL" --token=node-token --name=first --driver="$DRIVER" \
  --node=node-1 --count=1)"
FIRST="$(prepare "$CLAIM_A")"
expect_contains "the first claim is prepared" "$FIRST" ": ok"
check "the plugin was called once" test "$(allocates)" -eq 1
kill -9 "$PROXY_PID"; wait "$PROXY_PID" 2>/dev/null
expect_exit "dpctl reads the journal dpproxy left" 0 "$DPCTL" state --state_dir="$STATE"
expect_contains "the claim is in it" "$LAST_OUT" "claim default/first"
check "its path is DRA" bash -c "grep 'claim default/first' <<<'$LAST_OUT' | grep -q ' dra '"

start_proxy
wait_until "dpproxy serves again" 400 serving 2
AGAIN="$(prepare "$CLAIM_A")"
check "prepared again, the same answer" test "$AGAIN" = "$FIRST"
check "without the plugin" test "$(allocates)" -eq 1

# dpproxy killed while the plugin's Allocate of a second claim is under way.
CLAIM_B="$("$API" claim --server="$URL" --token=node-token --name=second --driver="$DRIVER" \
  --node=node-1 --count=1)"
prepare "$CLAIM_B" >"$DIR/prepare-b.out" &
PREPARE_PID=$!
wait_until "the plugin is allocating for the second claim" 200 allocated_at_least 2
kill -9 "$PROXY_PID"; wait "$PROXY_PID" 2>/dev/null
wait "$PREPARE_PID"
check "that prepare was not answered ok" bash -c "! grep -q ': ok' '$DIR/prepare-b.out'"
expect_exit "dpctl reads the journal" 0 "$DPCTL" state --state_dir="$STATE"
expect_contains "the first claim is kept" "$LAST_OUT" "claim default/first"
check "the second, if journaled, only as reserved" \
  bash -c "! grep 'claim default/second' <<<'$LAST_OUT' | grep -v -q reserved"

start_proxy
wait_until "dpproxy serves once more" 400 serving 3
expect_exit "dpctl" 0 "$DPCTL" state --state_dir="$STATE"
expect_contains "the start released the unfinished claim" "$LAST_OUT" "1 allocation(s)"
check "nothing of the second" bash -c "! grep -q 'claim default/second' <<<'$LAST_OUT'"
expect_contains "the kubelet's next prepare of it succeeds" "$(prepare "$CLAIM_B")" ": ok"
expect_exit "dpctl" 0 "$DPCTL" state --state_dir="$STATE"
expect_contains "both claims are journaled" "$LAST_OUT" "2 allocation(s)"

# A pod of the extended resource the scheduler served through DRA: its
# container is given its claim's device, and deleting the pod unprepares
# the claim.
CLAIM_C="$("$API" claim --server="$URL" --token=node-token --name=pod-x-extended-resources-b2c4d \
  --driver="$DRIVER" --node=node-1 --count=1 --request=container-0-request-0)"
expect_exit "kubelet_sim admits a pod served by its claim" 0 "$SIM" allocate --root_dir="$ROOT" \
  --pod=pod-x --containers=main=example.com/gpu:1 --extended_claim="$CLAIM_C" \
  --driver="$DRIVER" --request_mappings=main=example.com/gpu:container-0-request-0
expect_contains "... its container has the claim's device" "$LAST_OUT" \
  "(claim pod-x-extended-resources-b2c4d)"
expect_contains "... and its CDI name" "$LAST_OUT" "    cdi $DRIVER/"
POD_X="$(sed -n 's/^pod uid \(.*\) admitted$/\1/p' <<<"$LAST_OUT")"
expect_exit "dpctl" 0 "$DPCTL" state --state_dir="$STATE"
expect_contains "the pod's claim is journaled" "$LAST_OUT" "claim default/pod-x-extended-resources-b2c4d"
expect_exit "deleting the pod" 0 "$SIM" delete-pod --root_dir="$ROOT" --uid="$POD_X"
expect_exit "dpctl" 0 "$DPCTL" state --state_dir="$STATE"
check "its claim was unprepared" bash -c "! grep -q pod-x-extended <<<'$LAST_OUT'"
expect_exit "a mapping that names no request is refused" 1 "$SIM" allocate --root_dir="$ROOT" \
  --pod=pod-y --containers=main=example.com/gpu:1 --extended_claim="$CLAIM_C" \
  --driver="$DRIVER" --request_mappings=main=example.com/gpu
expect_contains "... named" "$LAST_OUT" 'request mapping "main=example.com/gpu" is not CONTAINER=RESOURCE:REQUEST'

# Unprepared: the journal lets their devices go.
"$SIM" unprepare --root_dir="$ROOT" --driver="$DRIVER" --claims="$CLAIM_A,$CLAIM_B" >/dev/null
kill -TERM "$PROXY_PID"; wait "$PROXY_PID" 2>/dev/null
expect_exit "dpctl" 0 "$DPCTL" state --state_dir="$STATE"
expect_contains "no claim is left" "$LAST_OUT" "0 allocation(s)"
finish
