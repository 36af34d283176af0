#!/usr/bin/env bash
# SIGTERM while dpproxy waits on an API server that answers late (here
# 15 s, within the 30 s an API call may take): dpproxy in DRA mode, still
# starting, its first call to the API server under way, is stopped with
# SIGTERM. Its API calls end at once and it exits 0 well before the server
# would have answered; it never has to be killed.
source "$(dirname "$0")/lib.sh"
ROOT="$DIR/kubelet"
mkdir -p "$ROOT/plugins_registry" "$ROOT/plugins" "$ROOT/device-plugins"

start_apiserver node-token --latency=15s --events="$DIR/api.jsonl"

"$PROXY" --kubelet_api=dra --dra_driver=gpu.example.com --node_name=node-1 \
  --kubeconfig="$DIR/kubeconfig" --cdi_dir="$DIR/cdi" --kubelet_root="$ROOT" \
  --plugin_dir="$DIR/dpproxy/device-plugins" --state_dir="$DIR/dpproxy" \
  --metrics_address= 2>"$DIR/proxy.log" &
PROXY_PID=$!
PIDS+=("$PROXY_PID")
wait_until "dpproxy's first API call is held by the server" 200 \
  grep -q request_delayed "$DIR/api.jsonl"
kill -TERM "$PROXY_PID"
gone() { ! kill -0 "$PROXY_PID" 2>/dev/null; }
# Within 5 s (the server answers after 15 s, and an API call may take 30).
wait_until "dpproxy exits on SIGTERM while its API call waits" 100 gone
wait "$PROXY_PID"
rc=$?
check "dpproxy exits 0 (exit $rc)" [ "$rc" -eq 0 ]
check "dpproxy says the signal came while it started" \
  grep -q "received while starting: API calls cancelled" "$DIR/proxy.log"
if [[ "$rc" -ne 0 ]]; then log_end "$DIR/proxy.log"; fi
finish
