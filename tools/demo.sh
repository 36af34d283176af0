#!/usr/bin/env bash
# The demo behind `tools/dev demo`: a legacy v1alpha (Kubernetes 1.9) device
# plugin, which a 1.25+ kubelet refuses, served to a simulated 1.25+ kubelet
# through dpproxy: registration, a pod with two containers, a kubelet
# restart survived. Usage: tools/demo.sh <bazel-bin directory>
set -euo pipefail

BIN="${1:?usage: tools/demo.sh <bazel-bin>}"
SIM="$BIN/tools/kubelet_sim/kubelet_sim"
PLUGIN="$BIN/tools/sample_plugin/sample_plugin"
PROXY="$BIN/proxy/dpproxy"
DIR="$(mktemp -d /tmp/dpp-demo.XXXXXX)"
ROOT="$DIR/kubelet"
PLUGINS="$DIR/dpproxy/device-plugins"
PIDS=()

# shellcheck source=tools/demo_lib.sh
source "$(dirname "$0")/demo_lib.sh"
trap cleanup EXIT

step "1. A simulated kubelet with 1.25+ behaviour (v1beta1, synchronous Register)"
"$SIM" serve --root_dir="$ROOT" --personality=v1beta1-sync --quiet &
PIDS+=($!)
wait_for test -S "$ROOT/device-plugins/kubelet.sock"
echo "   listening on $ROOT/device-plugins/kubelet.sock"

step "2. A legacy v1alpha plugin (Kubernetes 1.9 API) registering directly: refused, as in the field"
"$PLUGIN" --api=v1alpha --resource=example.com/gpu --devices=4 --id_pattern='gpu-{i}' \
  --socket_name=legacy-direct.sock \
  --kubelet_socket="$ROOT/device-plugins/kubelet.sock" --events="$DIR/direct.jsonl" --quiet &
DIRECT=$!
wait_for grep -q registration_failed "$DIR/direct.jsonl"
kill "$DIRECT"; wait "$DIRECT" 2>/dev/null || true
show_events "$DIR/direct.jsonl" registration_failed
echo "   -> the node would report example.com/gpu capacity 0"

step "3. dpproxy between them: kubelet side in $ROOT, plugins register at $PLUGINS/kubelet.sock"
"$PROXY" --kubelet_root="$ROOT" --plugin_dir="$PLUGINS" --events="$DIR/proxy.jsonl" \
  --status_file="$DIR/status.json" --state_dir="$DIR/dpproxy" --metrics_address= \
  2>"$DIR/proxy.log" &
PIDS+=($!)
wait_for test -S "$PLUGINS/kubelet.sock"

step "4. The same legacy plugin, unchanged, pointed at dpproxy"
"$PLUGIN" --api=v1alpha --resource=example.com/gpu --devices=4 --id_pattern='gpu-{i}' \
  --kubelet_socket="$PLUGINS/kubelet.sock" --events="$DIR/plugin.jsonl" --quiet &
PIDS+=($!)
"$SIM" wait --root_dir="$ROOT" --resource=example.com/gpu --min_healthy=4 --timeout=15s
show_events "$DIR/proxy.jsonl" backend_up kubelet_registered
show_events "$ROOT/kubelet_sim.events.jsonl" registered

step "5. A pod with two containers: the kubelet's v1beta1 calls become v1alpha calls, one per container"
"$SIM" allocate --root_dir="$ROOT" --pod=training \
  --containers=trainer=example.com/gpu:2,sidecar=example.com/gpu:1

step "6. The kubelet restarts (wipes device-plugins/): dpproxy re-registers at once, same device IDs"
"$SIM" restart --root_dir="$ROOT"
"$SIM" wait --root_dir="$ROOT" --resource=example.com/gpu --min_healthy=4 --timeout=15s
show_events "$DIR/proxy.jsonl" kubelet_restart_detected
grep -c '"event":"registered"' "$DIR/plugin.jsonl" | sed 's/^/   the plugin registered /; s/$/ time(s) in all: it never noticed/'

step "7. The kubelet's re-admission check after the restart: the running pod keeps its devices"
"$SIM" readmit --root_dir="$ROOT"

step "8. dpproxy itself crashes (SIGKILL) and comes back: nothing it answered is lost"
kill -KILL "${PIDS[1]}"; wait "${PIDS[1]}" 2>/dev/null || true
"$PROXY" --kubelet_root="$ROOT" --plugin_dir="$PLUGINS" --events="$DIR/proxy.jsonl" \
  --status_file="$DIR/status.json" --state_dir="$DIR/dpproxy" --metrics_address= \
  2>>"$DIR/proxy.log" &
PIDS[1]=$!
"$SIM" wait --root_dir="$ROOT" --resource=example.com/gpu --min_healthy=4 --timeout=15s
show_events "$DIR/proxy.jsonl" state_loaded resource_restored
"$BIN/tools/dpctl/dpctl" state --state_dir="$DIR/dpproxy" | sed 's/^/   /'
"$SIM" readmit --root_dir="$ROOT"

step "9. What dpproxy reports (dpproxy status), and what the kubelet sees"
"$PROXY" status --status_file="$DIR/status.json"
echo
"$SIM" state --root_dir="$ROOT"
echo
echo "Done. dpproxy's log was $DIR/proxy.log (removed on exit). Tests: tools/dev test; matrix: tools/dev matrix"
