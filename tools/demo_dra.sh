#!/usr/bin/env bash
# The demo behind `tools/dev demo-dra`: a legacy v1alpha (Kubernetes 1.9)
# device plugin served as a DRA driver (docs/dra.md) to a simulated 1.34
# kubelet and API server: its devices published as ResourceSlices, the
# driver registered through the plugin watcher, a claim allocated by a
# stand-in scheduler and prepared with a CDI spec, a kubelet restart
# survived without calling the plugin again.
# Usage: tools/demo_dra.sh <bazel-bin directory>
set -euo pipefail

BIN="${1:?usage: tools/demo_dra.sh <bazel-bin>}"
SIM="$BIN/tools/kubelet_sim/kubelet_sim"
API="$BIN/tools/apiserver_sim/apiserver_sim"
PLUGIN="$BIN/tools/sample_plugin/sample_plugin"
PROXY="$BIN/proxy/dpproxy"
DIR="$(mktemp -d /tmp/dpp-dra-demo.XXXXXX)"
ROOT="$DIR/kubelet"
PLUGINS="$DIR/dpproxy/device-plugins"
DRIVER=gpu.example.com
PIDS=()

# shellcheck source=tools/demo_lib.sh
source "$(dirname "$0")/demo_lib.sh"
trap cleanup EXIT

step "1. An API server (resource.k8s.io v1) and a 1.34 kubelet, both simulated"
"$API" --listen=127.0.0.1:0 --token=node-token --nodes=node-1=v1.34.3 --events="$DIR/api.jsonl" \
  >"$DIR/api.out" &
PIDS+=($!)
wait_for grep -q serving "$DIR/api.out"
URL="$(sed -n 's/^apiserver_sim: serving //p' "$DIR/api.out")"
echo "   API server at $URL"
cat >"$DIR/kubeconfig" <<KC
current-context: node
contexts: [{name: node, context: {cluster: sim, user: dpproxy}}]
clusters: [{name: sim, cluster: {server: "$URL"}}]
users: [{name: dpproxy, user: {token: node-token}}]
KC
# The sim resolves CDI names in $DIR/cdi as the container runtime would,
# and deletes the node's slices at each start as a kubelet does.
"$SIM" serve --root_dir="$ROOT" --kubelet=1.34 --kubeconfig="$DIR/kubeconfig" \
  --node_name=node-1 --cdi_dirs="$DIR/cdi" --quiet &
PIDS+=($!)
wait_for test -S "$ROOT/device-plugins/kubelet.sock"

step "2. dpproxy in DRA mode, driver $DRIVER on node node-1; a legacy v1alpha plugin pointed at it"
"$PROXY" --kubelet_api=dra --dra_driver="$DRIVER" --node_name=node-1 \
  --kubeconfig="$DIR/kubeconfig" --cdi_dir="$DIR/cdi" --kubelet_root="$ROOT" \
  --plugin_dir="$PLUGINS" --state_dir="$DIR/dpproxy" --status_file="$DIR/status.json" \
  --events="$DIR/proxy.jsonl" --metrics_address= 2>"$DIR/proxy.log" &
PIDS+=($!)
wait_for test -S "$PLUGINS/kubelet.sock"
"$PLUGIN" --api=v1alpha --resource=example.com/gpu --devices=4 --id_pattern='gpu-{i}' \
  --kubelet_socket="$PLUGINS/kubelet.sock" --quiet &
PIDS+=($!)
wait_for grep -q dra_pool_published "$DIR/proxy.jsonl"
show_events "$DIR/proxy.jsonl" backend_up dra_serving dra_pool_published
echo "   no device plugin reached the kubelet (it would win over DRA):"
"$SIM" state --root_dir="$ROOT" | grep -c '^resource' | sed 's/^/   resources registered as device plugins: /' || true

step "3. The kubelet's plugin watcher registers the driver (DRA v1 on 1.34)"
wait_for grep -q dra_driver_registered "$ROOT/kubelet_sim.events.jsonl"
show_events "$ROOT/kubelet_sim.events.jsonl" dra_driver_registered

step "4. The scheduler allocates two free devices of the published pool to a claim (a stand-in: apiserver_sim claim --count)"
CLAIM="$("$API" claim --server="$URL" --token=node-token --name=training --driver="$DRIVER" \
  --node=node-1 --count=2)"
echo "   claim $CLAIM"

step "5. The pod starts: the kubelet prepares the claim; dpproxy calls the plugin's Allocate and writes a CDI spec"
"$SIM" prepare --root_dir="$ROOT" --driver="$DRIVER" --claims="$CLAIM" | sed 's/^/   /'
echo "   CDI spec:"
sed 's/^/     /' "$DIR"/cdi/*.json

step "6. The kubelet restarts: it deletes the node's slices, registers the driver again, dpproxy publishes again; preparing again answers the same"
"$SIM" restart --root_dir="$ROOT" --kubelet=1.34
wait_for test "$(grep -c dra_driver_registered "$ROOT/kubelet_sim.events.jsonl")" -ge 2
wait_for test "$(grep -c dra_pool_published "$DIR/proxy.jsonl")" -ge 2
show_events "$ROOT/kubelet_sim.events.jsonl" node_slices_deleted
"$SIM" prepare --root_dir="$ROOT" --driver="$DRIVER" --claims="$CLAIM" | sed 's/^/   /'

step "7. The pod ends: the claim is unprepared and its CDI spec removed"
"$SIM" unprepare --root_dir="$ROOT" --driver="$DRIVER" --claims="$CLAIM" | sed 's/^/   /'
ls "$DIR/cdi" | wc -l | sed 's/^/   CDI specs left: /'

step "8. What dpproxy reports"
# The status file follows within a second.
wait_for grep -Eq '"claims_prepared": ?0' "$DIR/status.json"
"$PROXY" status --status_file="$DIR/status.json"
echo
echo "Done. Logs were in $DIR (removed on exit). See docs/dra.md."
