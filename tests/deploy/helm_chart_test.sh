#!/usr/bin/env bash
# The Helm chart (deploy/helm/dpproxy), rendered without a cluster or a helm
# binary by tools/helm_render (Go's text/template and sprig, as Helm) with
# its default values and with a second values file (DRA mode, Prometheus
# Operator objects): every object passes the schema check of the fields the
# chart sets, the configuration it writes is accepted by dpproxy itself
# (--check), and values a user could get wrong are refused naming the field.
set -uo pipefail

SRC="$TEST_SRCDIR/dpproxy"
CHART="$SRC/deploy/helm/dpproxy"
DPPROXY="$SRC/proxy/dpproxy"
T="$(mktemp -d "${TEST_TMPDIR:-/tmp}/helm.XXXXXX")"
source "$SRC/tests/testing/checks.sh"

# Built here with Debian's Go (GOPATH mode: sprig and yaml.v3 from
# /usr/share/gocode), into the test's own directory.
build() {
  GOPATH=/usr/share/gocode GO111MODULE=off GOCACHE="$T/go-cache" HOME="$T" \
    go build -o "$T/helm_render" "$SRC/tools/helm_render/main.go" >"$T/build.log" 2>&1
}
check "helm_render builds (needs golang-go, golang-github-masterminds-sprig-dev and golang-github-xeipuuv-gojsonschema-dev)" build || {
  cat "$T/build.log"; finish; }
render() { "$T/helm_render" "$@" "$CHART"; }
count() { grep -c "^kind: $1\$" "$2"; }

# --- Default values ------------------------------------------------------
# (Output goes to files inside the checked commands: check's own "ok" line
# stays on stdout.)
render_to() { local out="$1"; shift; render "$@" >"$out" 2>"$out.err" || { cat "$out.err"; return 1; }; }
check "default values render and pass the check" render_to "$T/default.yaml" --check
for k in ConfigMap DaemonSet ServiceAccount; do
  check "default: one $k" [ "$(count "$k" "$T/default.yaml")" = 1 ]
done
for k in ClusterRole Service ServiceMonitor PodMonitor; do
  check "default: no $k" [ "$(count "$k" "$T/default.yaml")" = 0 ]
done
check "default: the node-critical priority" grep -q "priorityClassName: system-node-critical" "$T/default.yaml"
check "default: the image is the chart's appVersion" \
  grep -q 'image: "registry.example.com/dpproxy:0.13.0"' "$T/default.yaml"
check "default: probes on /livez and /readyz" \
  bash -c "grep -q 'path: /livez' '$T/default.yaml' && grep -q 'path: /readyz' '$T/default.yaml'"
check "default: containerd's directory mounted read-only, its socket in the configuration" \
  bash -c "grep -q 'path: /run/containerd$' '$T/default.yaml' && grep -q 'readOnly: true' '$T/default.yaml' && grep -q 'container_runtime_endpoint: /run/containerd/containerd.sock' '$T/default.yaml'"
check "default: the recommended labels" grep -q "app.kubernetes.io/managed-by: Helm" "$T/default.yaml"
check "default: no capability, no escalation, a read-only root" \
  bash -c "grep -A1 'drop:' '$T/default.yaml' | grep -q -- '- ALL' &&
           grep -q 'allowPrivilegeEscalation: false' '$T/default.yaml' &&
           grep -q 'readOnlyRootFilesystem: true' '$T/default.yaml'"
render --data ConfigMap/dpproxy/dpproxy.yaml >"$T/default-config.yaml"
accepts() {  # config file, output file
  "$DPPROXY" --config="$1" --check >"$2" 2>&1 || { cat "$2"; return 1; }
}
check "default: dpproxy accepts the configuration the chart writes" \
  accepts "$T/default-config.yaml" "$T/default-check.out"
check "default: its plugin socket is under hostDir" \
  grep -q "plugin_dir: /var/lib/dpproxy/device-plugins" "$T/default-check.out"
check "default: upgrades start the new pod beside the old (surge, none unavailable)" \
  bash -c "grep -q 'maxSurge: 1' '$T/default.yaml' && grep -q 'maxUnavailable: 0' '$T/default.yaml'"
check "default: the new pod takes over, the old one waits to be deleted" \
  bash -c "grep -q -- '- --takeover' '$T/default.yaml' && grep -q -- '- --after_handoff=wait' '$T/default.yaml'"
printf 'takeover:\n  enabled: false\n' >"$T/surge-no-takeover.yaml"
check "a surge rollout without takeover is refused" \
  bash -c "! '$T/helm_render' --values '$T/surge-no-takeover.yaml' '$CHART' >/dev/null 2>'$T/surge.err'"
check "... naming takeover.enabled" grep -q "needs takeover.enabled" "$T/surge.err"
printf 'config:\n  kubelet:\n    registration: plugin-watcher\n' >"$T/watcher.yaml"
check "takeover with the plugin watcher is refused" \
  bash -c "! '$T/helm_render' --values '$T/watcher.yaml' '$CHART' >/dev/null 2>'$T/watcher.err'"
check "... naming the registration" grep -q "needs config.kubelet.registration kubelet" "$T/watcher.err"

# --- The docs' Helm commands, as written ----------------------------------
# Every `helm install` in docs/operations.md and the chart's README renders
# (its --set values given to helm_render the same way) and passes the check.
docs_cmds="$(for doc in "$SRC/docs/operations.md" "$CHART/README.md"; do
  sed -n '/^helm install/,/[^\\]$/p' "$doc" | sed -e ':a' -e '/\\$/N; s/\\\n//; ta'
done)"
n=0
while read -r cmd; do
  [[ -z "$cmd" ]] && continue
  n=$((n + 1))
  sets=()
  for kv in $(grep -oE -- '--set [^ ]+' <<<"$cmd" | cut -d' ' -f2); do sets+=(--set "$kv"); done
  check "docs command $n renders: $cmd" render_to "$T/docs-$n.yaml" --check "${sets[@]}"
done <<<"$docs_cmds"
check "the docs have Helm commands to check ($n)" [ "$n" -ge 3 ]
check "the documented DRA command upgrades without a gap, with takeover" \
  bash -c "grep -q 'maxSurge: 1' '$T/docs-2.yaml' && grep -q -- '--takeover' '$T/docs-2.yaml'"

# --- DRA mode, monitoring, other paths -----------------------------------
V="$SRC/tests/deploy/helm-values-dra.yaml"
check "second values render and pass the check" \
  render_to "$T/dra.yaml" --values "$V" --release gpu --namespace node-agents --check
for k in ClusterRole ClusterRoleBinding Service ServiceMonitor; do
  check "dra: one $k" [ "$(count "$k" "$T/dra.yaml")" = 1 ]
done
check "dra: no PodMonitor beside the ServiceMonitor" [ "$(count PodMonitor "$T/dra.yaml")" = 0 ]
check "default: no DeviceClass" [ "$(count DeviceClass "$T/default.yaml")" = 0 ]
check "the documented DRA command: a DeviceClass selecting its driver" \
  bash -c "[ \$(grep -c '^kind: DeviceClass\$' '$T/docs-2.yaml') = 1 ] &&
           grep -q 'name: gpu-vendor-com\$' '$T/docs-2.yaml' &&
           grep -qF 'expression: \"device.driver == \\\"gpu.vendor.com\\\"\"' '$T/docs-2.yaml'"
check "dra: the DeviceClass can serve the extended resource" \
  render_to "$T/dc.yaml" --check --set dra.enabled=true --set dra.driver=gpu.vendor.com \
  --set dra.deviceClass.extendedResourceName=vendor.com/gpu
check "... extendedResourceName: vendor.com/gpu" grep -q 'extendedResourceName: "vendor.com/gpu"' "$T/dc.yaml"
check "dra: the DeviceClass can be left out" \
  render_to "$T/nodc.yaml" --check --set dra.enabled=true --set dra.driver=gpu.vendor.com \
  --set dra.deviceClass.create=false
check "... and is" [ "$(count DeviceClass "$T/nodc.yaml")" = 0 ]
check "a PodMonitor alone renders" \
  render_to "$T/podmonitor.yaml" --set metrics.podMonitor.enabled=true --check
check "... one PodMonitor, no ServiceMonitor" \
  bash -c "[ \$(grep -c '^kind: PodMonitor\$' '$T/podmonitor.yaml') = 1 ] && ! grep -q '^kind: ServiceMonitor\$' '$T/podmonitor.yaml'"
check "both monitors are refused" bash -c "! '$T/helm_render' --set metrics.podMonitor.enabled=true \
  --set metrics.serviceMonitor.enabled=true '$CHART' >/dev/null 2>'$T/monitors.err'"
check "... naming both" grep -q "serviceMonitor and metrics.podMonitor are both enabled" "$T/monitors.err"
check "dra: objects are named after the release" grep -q "name: gpu-dpproxy$" "$T/dra.yaml"
check "dra: the service account asked for" grep -q "serviceAccountName: gpu-bridge" "$T/dra.yaml"
check "dra: the role is bound to it in the release namespace" \
  bash -c "grep -A3 '^subjects:' '$T/dra.yaml' | grep -q 'namespace: node-agents'"
check "dra: the pinned image" grep -q 'image: "registry.internal:5000/infra/dpproxy:0.7.0-rc1"' "$T/dra.yaml"
check "dra: the DRA socket directory and the CDI directory are mounted" \
  bash -c "grep -q 'mountPath: /data/kubelet/plugins$' '$T/dra.yaml' && grep -q 'mountPath: /var/run/cdi' '$T/dra.yaml'"
check "dra: extra flags are passed" grep -q -- '- "--v=1"' "$T/dra.yaml"
check "dra: a values map is merged, not replaced (the default request stays)" \
  bash -c "grep -A6 '^          resources:' '$T/dra.yaml' | grep -q 'cpu: 10m'"
render --values "$V" --release gpu --namespace node-agents \
  --data ConfigMap/gpu-dpproxy/dpproxy.yaml >"$T/dra-config.yaml"
# The node's name comes from NODE_NAME, as the DaemonSet sets it.
export NODE_NAME=node-1
check "dra: dpproxy accepts the configuration the chart writes" \
  accepts "$T/dra-config.yaml" "$T/dra-check.out"
unset NODE_NAME
check "dra: it runs in DRA mode for the driver" \
  bash -c "grep -q 'api: dra' '$T/dra-check.out' && grep -q 'driver: gpu.vendor.com' '$T/dra-check.out'"
check "dra: the user's own settings are kept" grep -q "policy: hold" "$T/dra-check.out"
check "dra: paths follow kubeletRoot" grep -q "root: /data/kubelet" "$T/dra-check.out"
check "dra: no takeover where the values turn it off" bash -c "! grep -q -- '--takeover' '$T/dra.yaml'"

# --- Mistakes are named ----------------------------------------------------
echo 'dra: {enabled: true}' >"$T/no-driver.yaml"
check "DRA without a driver is refused" bash -c "! '$T/helm_render' --values '$T/no-driver.yaml' '$CHART' >/dev/null 2>'$T/no-driver.err'"
check "... naming dra.driver" grep -q "dra.driver is required" "$T/no-driver.err"
check "broken values fail the check" bash -c "! '$T/helm_render' --check --values '$SRC/tests/deploy/helm-values-broken.yaml' '$CHART' >/dev/null 2>'$T/broken.err'"
check "... naming the quantity" grep -q 'resources.requests.memory: "lots" is not a quantity' "$T/broken.err"
check "... naming the toleration" grep -q 'tolerations\[0\].operator: "Sometimes" is not Equal or Exists' "$T/broken.err"
# The values' schema (values.schema.json), checked before anything is
# rendered, as Helm does: each violation named.
check "values against the schema are refused" bash -c "! '$T/helm_render' --set metrics.port=70000 \
  --set logFormat=xml --set dra.enabled=yes --set takeover.enable=true '$CHART' >/dev/null 2>'$T/schema.err'"
check "... in Helm's words" grep -q "values don't meet the specifications of the schema(s)" "$T/schema.err"
check "... naming the port" grep -q 'metrics.port: Must be less than or equal to 65535' "$T/schema.err"
check "... naming the log format" grep -q 'logFormat: logFormat must be one of the following: "text", "json"' "$T/schema.err"
check "... naming the type" grep -q 'dra.enabled: Invalid type. Expected: boolean, given: string' "$T/schema.err"
check "... naming the misspelt key" grep -q 'takeover: Additional property enable is not allowed' "$T/schema.err"
check "every values file of the tests meets the schema" bash -c "for f in '$SRC'/tests/deploy/helm-values-*.yaml; do
  '$T/helm_render' --values \"\$f\" '$CHART' >/dev/null || exit 1; done"
# A misspelt key in a template is an unknown field, as strict validation says.
cp -r "$CHART" "$T/chart"
sed -i 's/volumeMounts:/volumeMount:/' "$T/chart/templates/daemonset.yaml"
check "a misspelt field in a template fails the check" bash -c "! '$T/helm_render' --check '$T/chart' >/dev/null 2>'$T/typo.err'"
check "... naming it" grep -q 'unknown field "volumeMount"' "$T/typo.err"
finish
