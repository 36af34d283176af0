#!/usr/bin/env bash
# The demo behind `tools/dev demo`: a simulated 1.25+ kubelet and a sample
# v1beta1 device plugin in a temporary directory: registration, a pod
# admitted with two containers, a kubelet restart survived. Usage:
#   tools/demo.sh <bazel-bin directory>
set -euo pipefail

BIN="${1:?usage: tools/demo.sh <bazel-bin>}"
SIM="$BIN/tools/kubelet_sim/kubelet_sim"
PLUGIN="$BIN/tools/sample_plugin/sample_plugin"
DIR="$(mktemp -d /tmp/dpp-demo.XXXXXX)"
ROOT="$DIR/kubelet"
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show_events() {  # file, event names...
  local file="$1"; shift
  local pattern; pattern="$(printf '"event":"%s"|' "$@")"
  grep -E "${pattern%|}" "$file" | sed -E 's/^\{//; s/\}$//; s/"([a-z_]+)":/\1=/g; s/^/   /' | cut -c1-160 || true
}

step "1. Start a kubelet simulator with 1.25+ behaviour (synchronous Register) in $ROOT"
"$SIM" serve --root_dir="$ROOT" --personality=v1beta1-sync --quiet &
PIDS+=($!)
for _ in $(seq 50); do [[ -S "$ROOT/device-plugins/kubelet.sock" ]] && break; sleep 0.1; done
echo "   listening on $ROOT/device-plugins/kubelet.sock"

step "2. Start a v1beta1 sample plugin: 4 GPUs on 2 NUMA nodes, preferred allocation, PreStart"
"$PLUGIN" --resource=example.com/gpu --devices=4 --id_pattern='gpu-{i}' --numa_nodes=2 \
  --preferred --pre_start_required \
  --kubelet_socket="$ROOT/device-plugins/kubelet.sock" --events="$DIR/plugin.jsonl" --quiet &
PIDS+=($!)
"$SIM" wait --root_dir="$ROOT" --resource=example.com/gpu --min_healthy=4 --timeout=15s
show_events "$ROOT/kubelet_sim.events.jsonl" registered devices

step "3. Admit a pod with two containers (the kubelet asks the plugin for its preference first)"
"$SIM" allocate --root_dir="$ROOT" --pod=training \
  --containers=trainer=example.com/gpu:2,sidecar=example.com/gpu:1

step "4. Restart the kubelet: it wipes device-plugins/, the plugin notices and registers again"
"$SIM" restart --root_dir="$ROOT"
"$SIM" wait --root_dir="$ROOT" --resource=example.com/gpu --min_healthy=4 --timeout=15s
show_events "$DIR/plugin.jsonl" socket_recreated registered

step "5. Re-admission after the restart: the pod's devices are registered and healthy"
"$SIM" readmit --root_dir="$ROOT"

step "6. Final state"
"$SIM" state --root_dir="$ROOT"
echo
echo "Done. Event logs were in $DIR (removed on exit). Run the tests with: tools/dev test"
