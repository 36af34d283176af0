#!/usr/bin/env bash
# The shipped binaries as a user runs them: real processes, real sockets,
# real signals. Checks --help, bad flags, the CLI round trip and shutdown.
set -uo pipefail

source "${TEST_SRCDIR:-$PWD/..}/dpproxy/tests/integration/lib.sh"
ROOT="$DIR/k"

# --help explains every flag each binary defines.
help="$("$SIM" --help)"
for flag in root_dir kubelet cdi_gate personality grace dial_timeout events control_socket quiet pod_resources \
            pod pod_namespace uid containers batch output resource min_healthy timeout; do
  expect_contains "kubelet_sim --help lists --$flag" "$help" "--$flag ("
done
expect_contains "kubelet_sim --help has no glog flags" "$(echo "$help" | grep -c -- '--logtostderr' || true)" "0"
help="$("$PLUGIN" --help)"
for flag in api resource devices id_pattern numa_nodes preferred pre_start_required kubelet_socket \
            socket_name registration plugins_registry_dir register_version flip_device \
            flip_interval single_stream_updates allocate_delay fail_allocate control_socket \
            events quiet device health; do
  expect_contains "sample_plugin --help lists --$flag" "$help" "--$flag ("
done

# Bad input: a clear message and a non-zero exit.
expect_exit "bad personality" 1 "$SIM" serve --root_dir="$ROOT" --personality=v2
expect_contains "bad personality message" "$LAST_OUT" 'unknown kubelet "v2"'
expect_exit "kubelet too old" 1 "$SIM" serve --root_dir="$ROOT" --kubelet=1.8
expect_contains "kubelet too old message" "$LAST_OUT" 'kubelet 1.8 is not simulated'
expect_exit "cdi gate on a release without it" 1 "$SIM" serve --root_dir="$ROOT" --kubelet=1.27 --cdi_gate=on
expect_contains "cdi gate message" "$LAST_OUT" 'no DevicePluginCDIDevices feature gate'
expect_exit "bad cdi gate" 1 "$SIM" serve --root_dir="$ROOT" --kubelet=1.28 --cdi_gate=maybe
expect_contains "bad cdi gate message" "$LAST_OUT" '"maybe" is not on or off'
expect_exit "generations" 0 "$SIM" generations
expect_contains "generations lists 1.19-1.24" "$LAST_OUT" "1.19-1.24"
expect_contains "generations lists the aliases" "$LAST_OUT" "v1beta1-async = 1.24"
expect_exit "unknown subcommand" 2 "$SIM" frobnicate
expect_exit "bad api" 2 "$PLUGIN" --api=v3
expect_contains "bad api message" "$LAST_OUT" "--api=v3 is not v1alpha or v1beta1"
expect_exit "bad resource" 2 "$PLUGIN" --resource=gpu --kubelet_socket="$ROOT/x.sock"
expect_contains "bad resource message" "$LAST_OUT" 'the ResourceName "gpu" is invalid'
expect_exit "bad duration" 2 "$PLUGIN" --flip_interval=soon
expect_contains "bad duration message" "$LAST_OUT" "--flip_interval=soon is not a duration"
expect_exit "v1alpha with preferred" 2 "$PLUGIN" --api=v1alpha --preferred
expect_exit "one socket name, two resources" 2 "$PLUGIN" --resource=vendor.com/a,vendor.com/b \
  --socket_name=one.sock --kubelet_socket="$ROOT/x.sock"
expect_contains "one socket name, two resources message" "$LAST_OUT" \
  "--socket_name=one.sock names one socket, and 2 resources each need their own"
expect_exit "too long socket path" 2 "$PLUGIN" --kubelet_socket="/tmp/$(printf 'x%.0s' {1..120})/kubelet.sock"
expect_contains "too long socket message" "$LAST_OUT" "at most 107 bytes"
expect_exit "client without simulator" 1 "$SIM" state --root_dir="$DIR/nothing"
expect_contains "client without simulator message" "$LAST_OUT" "no simulator control socket"

# A real simulator and a real plugin, driven through the CLI.
"$SIM" serve --root-dir="$ROOT" --personality=v1beta1-async --quiet &
SIM_PID=$!; PIDS+=($SIM_PID)
wait_until "kubelet_sim control socket" 100 test -S "$ROOT/kubelet_sim.sock"
"$PLUGIN" --resource=vendor.com/gpu --devices=3 --kubelet-socket="$ROOT/device-plugins/kubelet.sock" \
  --control-socket="$DIR/plugin.ctl" --events="$DIR/plugin.jsonl" --quiet &
PLUGIN_PID=$!; PIDS+=($PLUGIN_PID)
expect_exit "wait for resource" 0 "$SIM" wait --root_dir="$ROOT" --resource=vendor.com/gpu --min_healthy=3 --timeout=10s
expect_exit "allocate via CLI" 0 "$SIM" allocate --root_dir="$ROOT" --pod=p1 --uid=uid-1 \
  --containers=a=vendor.com/gpu:1,b=vendor.com/gpu:dev-2 --output=json
expect_contains "allocation JSON has the explicit device" "$LAST_OUT" '"dev-2"'
expect_contains "allocation JSON has the env" "$LAST_OUT" '"SAMPLE_GPU_DEVICES"'
expect_exit "bad container spec" 1 "$SIM" allocate --root_dir="$ROOT" --containers=nodevice
expect_contains "bad container spec message" "$LAST_OUT" "is not NAME=RESOURCE:COUNT"
expect_exit "set-health" 0 "$PLUGIN" set-health --control_socket="$DIR/plugin.ctl" --device=dev-0 --health=Unhealthy
# allocatable counts healthy devices (allocated ones included): 3 -> 2.
wait_until "kubelet saw the flip" 100 sim_allocatable "$ROOT" 2
expect_exit "set-health back" 0 "$PLUGIN" set-health --control_socket="$DIR/plugin.ctl" --device=dev-0 --health=Healthy
wait_until "kubelet saw the flip back" 100 sim_allocatable "$ROOT" 3
expect_exit "restart via CLI" 0 "$SIM" restart --root_dir="$ROOT" --personality=v1beta1-sync
expect_exit "re-registered after restart" 0 "$SIM" wait --root_dir="$ROOT" --resource=vendor.com/gpu --min_healthy=3 --timeout=10s
expect_exit "readmit via CLI" 0 "$SIM" readmit --root_dir="$ROOT"
expect_contains "pod readmitted" "$LAST_OUT" "2 admitted, 0 failed"
expect_contains "checkpoint written" "$(cat "$ROOT/device-plugins/kubelet_internal_checkpoint")" '"PodUID":"uid-1"'
expect_exit "delete pod" 0 "$SIM" delete-pod --root_dir="$ROOT" --uid=uid-1
# DRA verbs: their flags are checked, and a driver the kubelet never
# registered is named (tests/proxy/dra_mode_test drives a registered one).
expect_exit "prepare needs --driver" 1 "$SIM" prepare --root_dir="$ROOT" --claims=default/c/u
expect_exit "prepare checks claims" 1 "$SIM" prepare --root_dir="$ROOT" --driver=gpu.example.com --claims=c
expect_contains "prepare names the claim format" "$LAST_OUT" "is not NAMESPACE/NAME/UID"
expect_exit "prepare an unknown driver" 1 "$SIM" prepare --root_dir="$ROOT" --driver=gpu.example.com \
  --claims=default/c/u
expect_contains "unknown driver named" "$LAST_OUT" "DRA driver gpu.example.com is not registered"

# A device that turns unhealthy under a running pod fails its re-admission.
expect_exit "allocate p2" 0 "$SIM" allocate --root_dir="$ROOT" --pod=p2 --containers=c=vendor.com/gpu:dev-1
expect_exit "flip dev-1" 0 "$PLUGIN" set-health --control_socket="$DIR/plugin.ctl" --device=dev-1 --health=Unhealthy
wait_until "kubelet saw dev-1 fail" 100 sim_allocatable "$ROOT" 2
expect_exit "readmit p2" 0 "$SIM" readmit --root_dir="$ROOT"
expect_contains "p2 refused" "$LAST_OUT" "previously allocated devices are no longer healthy"
expect_contains "p2 counted" "$LAST_OUT" "0 admitted, 1 failed"

# SIGTERM: both stop cleanly and remove their sockets.
kill -TERM "$PLUGIN_PID"; wait "$PLUGIN_PID"; rc=$?
[[ $rc -eq 0 ]] && pass "plugin exits 0 on SIGTERM" || fail "plugin exit $rc on SIGTERM"
[[ ! -e "$ROOT/device-plugins/sample-gpu.sock" ]] && pass "plugin socket removed" || fail "plugin socket left behind"
grep -q '"event":"signal"' "$DIR/plugin.jsonl" && pass "plugin logged the signal" || fail "no signal event"
kill -TERM "$SIM_PID"; wait "$SIM_PID"; rc=$?
[[ $rc -eq 0 ]] && pass "simulator exits 0 on SIGTERM" || fail "simulator exit $rc on SIGTERM"
[[ ! -e "$ROOT/kubelet_sim.sock" ]] && pass "control socket removed" || fail "control socket left behind"
grep -q '"event":"kubelet_stopped"' "$ROOT/kubelet_sim.events.jsonl" && pass "events file has kubelet_stopped" || fail "no kubelet_stopped event"

# dpproxy as a process: help, bad flags, a legacy plugin through it, SIGTERM.
help="$("$PROXY" --help)"
for flag in kubelet_root plugin_dir kubelet_api kubelet_registration backend_timeout dial_timeout \
            backend_loss_policy backend_hold rename static_backend cdi_annotations events \
            status_file output config state_dir restore_policy restore_hold reconcile_interval \
            reconcile_grace metrics_address socket_group backend_max_list_mib compact_ids check log_format; do
  expect_contains "dpproxy --help lists --$flag" "$help" "--$flag ("
done
expect_exit "dpproxy version" 0 "$PROXY" version
expect_contains "dpproxy version names itself" "$LAST_OUT" "dpproxy 0."
expect_exit "dpproxy --version" 0 "$PROXY" --version
# One exit-code policy and a version for every tool: --version exits 0 and
# says VERSION's version; an unknown flag is bad usage, 2.
VERSION="$(cat "$RUNFILES/VERSION")"
for tool in "$PROXY" "$DPCTL" "$SIM" "$PLUGIN"; do
  name="$(basename "$tool")"
  expect_exit "$name --version" 0 "$tool" --version
  expect_contains "$name --version says $VERSION" "$LAST_OUT" "$name $VERSION"
done
expect_exit "dpproxy: an unknown flag is bad usage" 2 "$PROXY" --no_such_flag
expect_contains "... named" "$LAST_OUT" 'unknown flag "--no_such_flag"'
expect_exit "dpctl: an unknown flag is bad usage" 2 "$DPCTL" state --no_such_flag
expect_exit "kubelet_sim: an unknown flag is bad usage" 2 "$SIM" serve --no_such_flag
expect_exit "sample_plugin: an unknown flag is bad usage" 2 "$PLUGIN" --no_such_flag
expect_exit "dpproxy bad log format" 2 "$PROXY" --log_format=xml
printf 'kubelet: {root: /k}\nrenames: {"a.com/x": "b.com/y"}\n' >"$DIR/check.yaml"
expect_exit "dpproxy --check accepts a valid file" 0 "$PROXY" --config="$DIR/check.yaml" --check --state_dir=
expect_contains "--check says it is valid" "$LAST_OUT" "the configuration is valid"
expect_contains "--check prints the file's setting" "$LAST_OUT" "a.com/x: b.com/y"
expect_contains "--check prints defaults too" "$LAST_OUT" "backend_list_mib: 256"
expect_contains "--check prints flags given" "$LAST_OUT" 'state_dir: ""'
printf 'kubelet:\n  root: /k\n  colour: blue\n' >"$DIR/bad.yaml"
expect_exit "dpproxy --check refuses a bad file" 2 "$PROXY" --config="$DIR/bad.yaml" --check
expect_contains "--check names the line" "$LAST_OUT" "bad.yaml:3"
expect_exit "dpproxy bad kubelet_api" 2 "$PROXY" --kubelet_api=v2
expect_contains "dpproxy bad kubelet_api message" "$LAST_OUT" "--kubelet_api=v2 is not auto, v1alpha or v1beta1"
expect_exit "dpproxy bad compact_ids" 2 "$PROXY" --compact_ids=gpu --kubelet_root="$DIR/kr" --plugin_dir="$DIR/pr"
expect_contains "dpproxy bad compact_ids message" "$LAST_OUT" "compact IDs: "
expect_exit "dpproxy: the kubelet's pod-resources socket is not ours to serve" 2 "$PROXY" \
  --kubelet_root=/k --pod_resources_socket=/k/pod-resources/kubelet.sock --check --state_dir=
expect_contains "... named, with a path to use instead" "$LAST_OUT" \
  "is the kubelet's own pod-resources socket; dpproxy reads that one: give another path (e.g. /k/pod-resources/dpproxy.sock)"
expect_exit "dpproxy bad rename" 2 "$PROXY" --rename=nonsense
expect_contains "dpproxy bad rename message" "$LAST_OUT" '"nonsense" is not FROM=TO'
expect_exit "dpproxy plugin_dir = kubelet dir" 2 "$PROXY" --kubelet_root=/tmp/k --plugin_dir=/tmp/k/device-plugins
expect_exit "dpproxy bad duration" 2 "$PROXY" --backend_timeout=forever
printf 'kubelet:\n  rot: /x\n' > "$DIR/bad.yaml"
expect_exit "dpproxy bad config file" 2 "$PROXY" --config="$DIR/bad.yaml"
expect_contains "bad config file message" "$LAST_OUT" "bad.yaml:2:3: kubelet.rot: unknown key"
# DRA mode with an API server needs the HTTPS module: a dpproxy copied away
# from it says so and where it looked.
mkdir -p "$DIR/lone"
cp "$PROXY" "$DIR/lone/dpproxy"
cat >"$DIR/lone/kubeconfig" <<'KC'
current-context: node
contexts: [{name: node, context: {cluster: c, user: u}}]
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
KC
# (Not in this test's runfiles either: RUNFILES_DIR is where a Bazel-run
# binary looks last.)
expect_exit "DRA mode without the HTTPS module" 1 env -u RUNFILES_DIR "$DIR/lone/dpproxy" --kubelet_api=dra \
  --dra_driver=gpu.example.com --node_name=n --kubeconfig="$DIR/lone/kubeconfig" \
  --kubelet_root="$DIR/lone/k" --plugin_dir="$DIR/lone/p" --state_dir="$DIR/lone/s" \
  --status_file="$DIR/lone/status.json" --metrics_address=
expect_contains "... names the module and where it looked" "$LAST_OUT" \
  "dpproxy-https.so (the Kubernetes API client's TLS) is not installed; looked at $DIR/lone/dpproxy-https.so, $DIR/lib/dpproxy/dpproxy-https.so"

R2="$DIR/r2"
# `dpproxy wait`: nothing serves there yet, then a dpproxy does.
expect_exit "dpproxy wait without a dpproxy" 1 "$PROXY" wait --plugin_dir="$R2/p" \
  --wait_timeout=200ms
expect_contains "dpproxy wait says what it waited for" "$LAST_OUT" \
  "nothing serves plugin registrations at $R2/p/kubelet.sock after 200ms"
expect_exit "dpproxy wait with a bad timeout" 2 "$PROXY" wait --wait_timeout=soon
"$SIM" serve --root-dir="$R2/k" --personality=v1beta1-sync --quiet &
SIM2=$!; PIDS+=($SIM2)
wait_until "kubelet socket" 100 test -S "$R2/k/device-plugins/kubelet.sock"
"$PROXY" --kubelet-root="$R2/k" --plugin-dir="$R2/p" --events="$R2/proxy.jsonl" \
  --status-file="$R2/status.json" --state-dir="$R2/state" --metrics-address=127.0.0.1:0 \
  2>"$R2/proxy.log" &
PROXY_PID=$!; PIDS+=($PROXY_PID)
expect_exit "dpproxy wait until the registration socket serves" 0 "$PROXY" wait \
  --plugin_dir="$R2/p" --wait_timeout=10s
"$PLUGIN" --api=v1alpha --resource=vendor.com/gpu --devices=2 --kubelet_socket="$R2/p/kubelet.sock" --quiet &
P2=$!; PIDS+=($P2)
expect_exit "legacy plugin through dpproxy" 0 "$SIM" wait --root_dir="$R2/k" --resource=vendor.com/gpu --min_healthy=2 --timeout=10s
expect_exit "allocate through dpproxy" 0 "$SIM" allocate --root_dir="$R2/k" --containers=c=vendor.com/gpu:2
# Without an API server, no TLS library is loaded (the HTTPS module is
# loaded only by the Kubernetes API client).
check "no TLS library in a dpproxy without an API server" \
  bash -c "! grep -E 'libssl|libcrypto|libcpp-httplib|dpproxy-https' /proc/$PROXY_PID/maps"
wait_until "status file shows the kubelet API" 100 grep -q '"kubelet_api":"v1beta1"' "$R2/status.json"
expect_exit "dpproxy status" 0 "$PROXY" status --status_file="$R2/status.json"
expect_contains "status shows the negotiated version" "$LAST_OUT" "vendor.com/gpu"
expect_contains "status shows both versions" "$LAST_OUT" "v1beta1                    v1alpha2"
expect_exit "dpproxy status json" 0 "$PROXY" status --status_file="$R2/status.json" --output=json
expect_contains "status json" "$LAST_OUT" '"backend_api": "v1alpha2"'
expect_exit "dpproxy status without proxy" 1 "$PROXY" status --status_file="$R2/none.json"
expect_contains "the status file says ready" "$(cat "$R2/status.json")" '"ready":true'
# Not ready (as /readyz would say): the table says why, and the exit code is 3.
sed 's/"not_ready":\[\]/"not_ready":[{"check":"registered:vendor.com\/gpu","reason":"the kubelet has not answered"}]/' \
  "$R2/status.json" >"$R2/not-ready.json"
expect_exit "dpproxy status when not ready" 3 "$PROXY" status --status_file="$R2/not-ready.json"
expect_contains "... says why" "$LAST_OUT" "NOT READY:"
expect_contains "... names the check" "$LAST_OUT" "registered:vendor.com/gpu: the kubelet has not answered"
port="$(grep -o 'metrics at http://127.0.0.1:[0-9]*' "$R2/proxy.log" | grep -o '[0-9]*$' | head -1)"
if [[ -n "$port" ]] && exec 3<>"/dev/tcp/127.0.0.1/$port"; then
  printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
  scrape="$(timeout 5 cat <&3)"; exec 3<&-
  expect_contains "metrics endpoint times allocations" "$scrape" 'dpproxy_rpc_duration_seconds_count{backend_api="v1alpha2",code="OK",kubelet_api="v1beta1",method="Allocate",resource="vendor.com/gpu",side="kubelet"} 1'
  expect_contains "metrics endpoint serves devices" "$scrape" 'dpproxy_devices{resource="vendor.com/gpu",health="healthy"} 2'
  http_get() {  # path: the whole answer, headers and body
    exec 4<>"/dev/tcp/127.0.0.1/$port" || return 1
    printf 'GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$1" >&4
    timeout 5 cat <&4; exec 4<&-
  }
  ready="$(http_get '/readyz?verbose')"
  expect_contains "readyz answers 200" "$ready" "HTTP/1.1 200"
  expect_contains "readyz lists the registration" "$ready" "[+]registered:vendor.com/gpu ok"
  expect_contains "readyz lists the state" "$ready" "[+]state-writable ok"
  expect_contains "readyz passes" "$ready" "readyz check passed"
  expect_contains "livez answers ok" "$(http_get /livez)" $'\r\n\r\nok'
else
  fail "no metrics endpoint (port '$port')"
fi
expect_contains "glog line names both versions" "$(cat "$R2/proxy.log")" "registered with the kubelet as v1beta1 (backend v1alpha2"
# The kubelet comes back without its checkpoint while the pod runs: the
# pod's devices are held as forgotten by the kubelet, and dpproxy status says
# which pod holds them.
kill -TERM "$SIM2"; wait "$SIM2" 2>/dev/null
rm -f "$R2/k/device-plugins/kubelet_internal_checkpoint"
"$SIM" serve --root-dir="$R2/k" --personality=v1beta1-sync --quiet &
SIM2=$!; PIDS+=($SIM2)
wait_until "status file shows a forgotten hold" 200 grep -q '"forgotten":\[{' "$R2/status.json"
wait_until "status file says ready again" 200 grep -q '"ready":true' "$R2/status.json"
expect_exit "dpproxy status after a lost checkpoint" 0 "$PROXY" status --status_file="$R2/status.json"
expect_contains "status lists the forgotten hold" "$LAST_OUT" "FORGOTTEN BY THE KUBELET"
expect_contains "status names the devices' holder" "$LAST_OUT" "vendor.com/gpu dev-0,dev-1 held by"
expect_contains "status says why" "$LAST_OUT" "checkpoint"
kill -TERM "$PROXY_PID"; wait "$PROXY_PID"; rc=$?
[[ $rc -eq 0 ]] && pass "dpproxy exits 0 on SIGTERM" || fail "dpproxy exit $rc on SIGTERM"
[[ ! -e "$R2/k/device-plugins/dpproxy-vendor.com_gpu.sock" ]] && pass "dpproxy kubelet-side socket removed" || fail "kubelet-side socket left behind"
[[ ! -e "$R2/p/kubelet.sock" ]] && pass "dpproxy registration socket removed" || fail "registration socket left behind"
grep -q '"event":"proxy_stopped"' "$R2/proxy.jsonl" && pass "proxy_stopped event" || fail "no proxy_stopped event"
[[ ! -e "$R2/status.json" ]] && pass "status file removed on stop" || fail "status file left behind"
kill -TERM "$P2" "$SIM2"; wait "$P2" "$SIM2" 2>/dev/null

# dpctl reads the state dpproxy left behind, without dpproxy running.
expect_exit "dpctl verify" 0 "$DPCTL" verify --state_dir="$R2/state"
expect_contains "dpctl verify counts" "$LAST_OUT" "1 allocation(s)"
# Flags before the subcommand, and a flag's value after a space, alike.
expect_exit "dpctl flags first" 0 "$DPCTL" --state_dir "$R2/state" verify
expect_exit "dpctl: an argument verify does not take" 2 "$DPCTL" verify extra --state_dir="$R2/state"
expect_contains "dpctl names the argument" "$LAST_OUT" 'unexpected argument "extra"'
expect_exit "dpctl cordon without dpproxy running" 1 "$DPCTL" --state_dir="$R2/state" \
  cordon vendor.com/gpu dev-0 --reason "ECC errors"
expect_contains "dpctl says no dpproxy serves the control socket" "$LAST_OUT" "control.sock"
expect_exit "dpctl state table" 0 "$DPCTL" state --state_dir="$R2/state"
expect_contains "dpctl table lists the resource" "$LAST_OUT" "vendor.com/gpu"
expect_contains "dpctl table lists the allocation" "$LAST_OUT" "dev-0,dev-1"
check "dpctl table says the allocation came through the device plugin" \
  bash -c "grep 'dev-0,dev-1' <<<'$LAST_OUT' | grep -q ' device-plugin '"
expect_exit "dpctl state json" 0 "$DPCTL" state --state_dir="$R2/state" --output=json
expect_contains "dpctl json" "$LAST_OUT" '"backend_api": "v1alpha2"'
expect_contains "dpctl json shows the plugin's answer as a message" "$LAST_OUT" \
  '"SAMPLE_PLUGIN_API": "v1alpha"'
help="$("$DPCTL" --help)"
for flag in state_dir output plugin_dir reason; do
  expect_contains "dpctl --help lists --$flag" "$help" "--$flag ("
done
# Every state file gone: damage, since dpproxy's note in its plugin
# directory names the state directory; a directory nobody used is new.
mkdir -p "$DIR/lost.saved"; cp -a "$R2/state/." "$DIR/lost.saved"
find "$R2/state" -maxdepth 1 -type f -delete
expect_exit "dpctl verify every file gone" 1 "$DPCTL" verify --state_dir="$R2/state" \
  --plugin_dir="$R2/p"
expect_contains "dpctl calls it a loss" "$LAST_OUT" "every state file is gone, and dpproxy has used"
mkdir -p "$DIR/never-used"
expect_exit "dpctl verify a new directory" 1 "$DPCTL" verify --state_dir="$DIR/never-used" \
  --plugin_dir="$R2/p"
expect_contains "dpctl calls it a first start" "$LAST_OUT" "would start as on a first start"
cp -a "$DIR/lost.saved/." "$R2/state/"
# A torn journal tail is reported (dpproxy cuts it at start).
cp "$R2/state/journal.wal" "$DIR/journal.saved"
printf 'torn' >> "$R2/state/journal.wal"
expect_exit "dpctl verify torn tail" 1 "$DPCTL" verify --state_dir="$R2/state"
expect_contains "dpctl names the torn tail" "$LAST_OUT" "ends in a torn record"
cp "$DIR/journal.saved" "$R2/state/journal.wal"
# A directory in place of the journal: dpctl says dpproxy refuses to start.
mv "$R2/state/journal.wal" "$DIR/journal.saved2"; mkdir "$R2/state/journal.wal"
expect_exit "dpctl verify directory" 1 "$DPCTL" verify --state_dir="$R2/state"
expect_contains "dpctl says dpproxy refuses" "$LAST_OUT" "refuses to start"
"$PROXY" --kubelet-root="$R2/k" --plugin-dir="$R2/p" --state-dir="$R2/state" --status-file= \
  --metrics-address= >"$DIR/refused.log" 2>&1
rc=$?
[[ $rc -ne 0 ]] && pass "dpproxy refuses to start on a directory in place of its journal" || fail "dpproxy started on half its state"
expect_contains "dpproxy names the directory" "$(cat "$DIR/refused.log")" "journal.wal: Is a directory"
rmdir "$R2/state/journal.wal"; mv "$DIR/journal.saved2" "$R2/state/journal.wal"
# A damaged file is refused by dpctl (and left in place) ...
printf 'X' | dd of="$R2/state/state.pb" bs=1 seek=40 conv=notrunc status=none
expect_exit "dpctl verify damaged" 1 "$DPCTL" verify --state_dir="$R2/state"
expect_contains "dpctl names the damage" "$LAST_OUT" "checksum mismatch"
[[ -e "$R2/state/state.pb" ]] && pass "dpctl leaves the damaged file alone" || fail "dpctl moved the file"
# ... and moved aside by dpproxy at start, which starts from nothing.
"$PROXY" --kubelet-root="$R2/k" --plugin-dir="$R2/p" --state-dir="$R2/state" --status-file= \
  --metrics-address=0.0.0.0:0 \
  --events="$R2/proxy2.jsonl" 2>"$R2/proxy2.log" &
PROXY3=$!; PIDS+=($PROXY3)
wait_until "event state_untrusted" 100 grep -q state_untrusted "$R2/proxy2.jsonl"
expect_contains "dpproxy reports the untrusted state" "$(cat "$R2/proxy2.log")" "is not trusted (checksum mismatch); moved aside to"
ls "$R2/state" | grep -q "state.pb.corrupt-" && pass "damaged state kept aside" || fail "no .corrupt- file"
wait_until "event metrics_exposed" 100 grep -q metrics_exposed "$R2/proxy2.jsonl"
expect_contains "dpproxy warns about metrics off loopback" "$(cat "$R2/proxy2.log")" "which is not a loopback address"
kill -TERM "$PROXY3"; wait "$PROXY3"

# SIGHUP re-reads the --config file: a broken file is refused and dpproxy
# keeps running; a good one is applied and the change named.
R3="$DIR/r3"; mkdir -p "$R3"
printf 'backend_loss:\n  policy: unhealthy\n' >"$R3/dpproxy.yaml"
"$PROXY" --config="$R3/dpproxy.yaml" --kubelet-root="$R3/k" --plugin-dir="$R3/p" --state-dir= \
  --status-file="$R3/status.json" --metrics-address= --events="$R3/events.jsonl" 2>"$R3/proxy.log" &
PROXY4=$!; PIDS+=($PROXY4)
wait_until "dpproxy with --config started" 100 grep -q proxy_started "$R3/events.jsonl"
printf 'backend_loss:\n  policy: sometimes\n' >"$R3/dpproxy.yaml"
kill -HUP "$PROXY4"
wait_until "a broken file is refused on SIGHUP" 100 grep -q config_reload_refused "$R3/events.jsonl"
kill -0 "$PROXY4" 2>/dev/null && pass "dpproxy keeps running after a refused reload" || fail "dpproxy died on SIGHUP"
expect_contains "the refusal names file and line" "$(cat "$R3/proxy.log")" "dpproxy.yaml:2:"
printf 'backend_loss:\n  policy: hold\n  hold: 30s\n' >"$R3/dpproxy.yaml"
# Without a shell (the image has none): `dpproxy reload` finds the process
# through its status file.
wait_until "the status file exists" 100 test -s "$R3/status.json"
expect_exit "dpproxy reload" 0 "$PROXY" reload --status_file="$R3/status.json"
expect_contains "reload names the process" "$LAST_OUT" "(pid $PROXY4, named by $R3/status.json)"
wait_until "a good file is applied on reload" 100 grep -q config_reloaded "$R3/events.jsonl"
expect_contains "the reload names the change" "$(grep config_reloaded "$R3/events.jsonl")" \
  "backend_loss.policy: unhealthy -> hold"
# A status file whose process is no dpproxy (an old one, its pid reused):
# nothing is sent.
sed -E "s/\"pid\":[0-9]+/\"pid\":$$/" "$R3/status.json" >"$R3/stale.json"
expect_exit "dpproxy reload refuses a pid that is not dpproxy" 1 "$PROXY" reload --status_file="$R3/stale.json"
expect_contains "... and says so" "$LAST_OUT" "is not a dpproxy"
expect_exit "dpproxy reload without a status file" 1 "$PROXY" reload --status_file="$R3/none.json"
expect_contains "... names the file" "$LAST_OUT" "no status at $R3/none.json"
kill -TERM "$PROXY4"; wait "$PROXY4"; rc=$?
[[ $rc -eq 0 ]] && pass "dpproxy exits 0 on SIGTERM after reloads" || fail "dpproxy exit $rc after reloads"

# --takeover: a new dpproxy process takes over from a running one (an
# upgrade beside it); the old one hands over, exits 0 on its own, and the
# kubelet keeps the resource with every device throughout.
R4="$DIR/r4"; mkdir -p "$R4"
"$SIM" serve --root-dir="$R4/k" --kubelet=1.24 --quiet &
SIM4=$!; PIDS+=($SIM4)
wait_until "kubelet for the takeover" 100 test -S "$R4/k/kubelet_sim.sock"
"$PROXY" --kubelet-root="$R4/k" --plugin-dir="$R4/p" --state-dir="$R4/state" --status-file= \
  --metrics-address= --events="$R4/old.jsonl" 2>"$R4/old.log" &
OLD=$!; PIDS+=($OLD)
wait_until "old dpproxy started" 100 grep -q proxy_started "$R4/old.jsonl"
"$PLUGIN" --resource=vendor.com/gpu --devices=2 --kubelet-socket="$R4/p/kubelet.sock" --quiet &
PLUGIN4=$!; PIDS+=($PLUGIN4)
expect_exit "resource through the old dpproxy" 0 "$SIM" wait --root_dir="$R4/k" \
  --resource=vendor.com/gpu --min_healthy=2 --timeout=10s
expect_exit "allocate through the old dpproxy" 0 "$SIM" allocate --root_dir="$R4/k" --pod=t1 \
  --uid=t1-uid --containers=c=vendor.com/gpu:1
"$PROXY" --takeover --after_handoff=wait --kubelet-root="$R4/k" --plugin-dir="$R4/p" \
  --state-dir="$R4/state" --status-file= --metrics-address= --events="$R4/new.jsonl" \
  2>"$R4/new.log" &
NEW=$!; PIDS+=($NEW)
wait_until "the new dpproxy completed the takeover" 200 grep -q takeover_complete "$R4/new.jsonl"
for _ in $(seq 200); do kill -0 "$OLD" 2>/dev/null || break; sleep 0.05; done
wait "$OLD"; rc=$?
[[ $rc -eq 0 ]] && pass "the old dpproxy exits 0 once handed over" || fail "old dpproxy exit $rc"
expect_contains "the old one logged the handoff" "$(cat "$R4/old.log")" "handed over to the new dpproxy"
expect_exit "the kubelet still has both devices" 0 "$SIM" wait --root_dir="$R4/k" \
  --resource=vendor.com/gpu --min_healthy=2 --timeout=10s
expect_exit "allocate through the new dpproxy" 0 "$SIM" allocate --root_dir="$R4/k" --pod=t2 \
  --containers=c=vendor.com/gpu:1
# A second upgrade: the one started with --after_handoff=wait hands over,
# closes everything and stays until SIGTERM (a container that would be
# restarted otherwise).
"$PROXY" --takeover --kubelet-root="$R4/k" --plugin-dir="$R4/p" --state-dir="$R4/state" \
  --status-file= --metrics-address= --events="$R4/newer.jsonl" 2>"$R4/newer.log" &
NEWER=$!; PIDS+=($NEWER)
wait_until "the second takeover completed" 200 grep -q takeover_complete "$R4/newer.jsonl"
wait_until "the waiting dpproxy closed everything" 200 grep -q proxy_stopped "$R4/new.jsonl"
kill -0 "$NEW" 2>/dev/null && pass "--after_handoff=wait: still running after the handoff" \
  || fail "--after_handoff=wait: it exited"
expect_contains "it says it waits" "$(cat "$R4/new.log")" "waiting for SIGTERM"
kill -TERM "$NEW"; wait "$NEW"; rc=$?
[[ $rc -eq 0 ]] && pass "--after_handoff=wait: exits 0 on SIGTERM" ||
  fail "waiting dpproxy exit $rc: $(log_end "$R4/new.log")"
expect_exit "the first pod ends" 0 "$SIM" delete-pod --root_dir="$R4/k" --uid=t1-uid
expect_exit "allocate after two upgrades" 0 "$SIM" allocate --root_dir="$R4/k" --pod=t3 \
  --containers=c=vendor.com/gpu:1
grep -q '"event":"plugin_lost"' "$R4/k/kubelet_sim.events.jsonl" \
  && fail "the kubelet lost the resource during the takeovers" || pass "no plugin loss in the kubelet"
expect_exit "a bad --after_handoff is named" 2 "$PROXY" --after_handoff=linger
expect_contains "... as not exit or wait" "$LAST_OUT" "--after_handoff=linger is not exit or wait"
kill -TERM "$NEWER"; wait "$NEWER"
kill -TERM "$PLUGIN4" "$SIM4"; wait "$PLUGIN4" "$SIM4"

# A node with 270,000 devices (three resources, each list within the
# kubelet's 4 MiB): its whole state is some 6 MB, past gRPC's default
# limit, and the control socket carries it.
R5="$DIR/r5"; mkdir -p "$R5"
"$SIM" serve --root-dir="$R5/k" --personality=v1beta1-sync --quiet &
SIM5=$!; PIDS+=($SIM5)
wait_until "kubelet_sim control socket (large node)" 100 test -S "$R5/k/kubelet_sim.sock"
LARGE=()
for r in a b c; do
  "$PLUGIN" --resource="vendor.com/many-$r" --devices=90000 --socket_name="many-$r.sock" \
    --kubelet-socket="$R5/k/device-plugins/kubelet.sock" --quiet &
  LARGE+=($!); PIDS+=($!)
done
for r in a b c; do
  expect_exit "wait for 90,000 devices of vendor.com/many-$r" 0 "$SIM" wait --root_dir="$R5/k" \
    --resource="vendor.com/many-$r" --min_healthy=90000 --timeout=60s
done
state_bytes="$("$SIM" state --root_dir="$R5/k" --output=json | wc -c)"
(( state_bytes > 4194304 )) && pass "state of a node with 270,000 devices ($state_bytes bytes)" \
  || fail "state of a node with 270,000 devices: $state_bytes bytes"
kill -TERM "${LARGE[@]}" "$SIM5"; wait "${LARGE[@]}" "$SIM5"

# Without --status_file, the status file is in the state directory, and
# `dpproxy status --state_dir` reads it there.
R6="$DIR/r6"; mkdir -p "$R6/k"
"$PROXY" --kubelet-root="$R6/k" --plugin-dir="$R6/p" --state-dir="$R6/state" --metrics-address= \
  2>"$R6/proxy.log" &
PROXY6=$!; PIDS+=($PROXY6)
wait_until "the status file follows --state_dir" 200 test -f "$R6/state/status.json"
expect_exit "dpproxy status --state_dir" 0 "$PROXY" status --state_dir="$R6/state"
expect_contains "... reads that dpproxy's status" "$LAST_OUT" "kubelet root $R6/k"
kill -TERM "$PROXY6"; wait "$PROXY6"
# A status file the configuration file names is kept where it says.
printf 'status_file: %s\n' "$R6/named.json" > "$R6/dpproxy.yaml"
"$PROXY" --config="$R6/dpproxy.yaml" --kubelet-root="$R6/k" --plugin-dir="$R6/p" \
  --state-dir="$R6/state2" --metrics-address= 2>"$R6/proxy2.log" &
PROXY7=$!; PIDS+=($PROXY7)
wait_until "a status file named in the configuration file stays there" 200 test -f "$R6/named.json"
[[ ! -e "$R6/state2/status.json" ]] && pass "... and not in the state directory" \
  || fail "the named status file was moved into the state directory"
kill -TERM "$PROXY7"; wait "$PROXY7"

finish
