#!/usr/bin/env bash
# The Debian package (tools/package:dpproxy_deb): its control fields and
# lintian, then installed with dpkg into a scratch root: files and modes,
# the conffile (an operator's edit survives reinstalling), the binaries run
# from the tree, systemd-analyze accepts the unit, removal keeps the
# conffile and the state directory's contents, and purge removes both. The
# maintainer scripts act under $DPKG_ROOT, never on this machine.
set -uo pipefail

DEB="$TEST_SRCDIR/dpproxy/tools/package/dpproxy.deb"
R="$(mktemp -d "${TEST_TMPDIR:-/tmp}/root.XXXXXX")"
source "$TEST_SRCDIR/dpproxy/tests/testing/checks.sh"
field() { dpkg-deb -f "$DEB" "$1"; }

check "package name" [ "$(field Package)" = dpproxy ]
VERSION="$(cat "$TEST_SRCDIR/dpproxy/VERSION")"
check "version is VERSION's ($VERSION)" [ "$(field Version)" = "$VERSION" ]
chart="$TEST_SRCDIR/dpproxy/deploy/helm/dpproxy/Chart.yaml"
check "the chart's version is VERSION's" grep -qx "version: $VERSION" "$chart"
check "the chart's appVersion is VERSION's" grep -qx "appVersion: \"$VERSION\"" "$chart"
check "a maintainer off localhost" bash -c "! dpkg-deb -f '$DEB' Maintainer | grep -q localhost"
if command -v lintian >/dev/null; then
  lint="$(lintian --pedantic --tag-display-limit 0 "$DEB" 2>/dev/null)"
  check "lintian --pedantic: no error or warning" bash -c "! grep -qE '^[EW]: ' <<<\"\$1\"" _ "$lint"
  grep -E '^[EW]: ' <<<"$lint"
else
  fail "lintian is not installed (tools/dev setup installs it)"
fi
check "architecture" [ "$(field Architecture)" = "$(dpkg --print-architecture)" ]
depends="$(field Depends)"
# The HTTPS module's library too (OpenSSL).
for p in libgrpc++1.51 libprotobuf32 libsystemd0 libuv1 libssl3; do
  check "depends on $p" grep -q "$p" <<<"$depends"
done

mkdir -p "$R/var/lib/dpkg/info" "$R/var/lib/dpkg/updates"
touch "$R/var/lib/dpkg/status" "$R/var/lib/dpkg/available"
install() {
  # The libraries live on this machine, not in the scratch root.
  dpkg --root="$R" --force-depends --force-script-chrootless --log=/dev/null -i "$DEB" \
    >"$R/install.log" 2>&1
}
check "dpkg installs it" install
mode() { stat -c '%a %U:%G' "$R$1"; }
check "dpproxy 0755 root" [ "$(mode /usr/bin/dpproxy)" = "755 root:root" ]
check "dpctl 0755 root" [ "$(mode /usr/bin/dpctl)" = "755 root:root" ]
check "dpconform 0755 root" [ "$(mode /usr/bin/dpconform)" = "755 root:root" ]
check "unit 0644" [ "$(mode /lib/systemd/system/dpproxy.service)" = "644 root:root" ]
check "config 0644" [ "$(mode /etc/dpproxy/dpproxy.yaml)" = "644 root:root" ]
check "state dir 0700, made by postinst" [ "$(mode /var/lib/dpproxy)" = "700 root:root" ]
check "HTTPS module 0644 root" [ "$(mode /usr/lib/dpproxy/dpproxy-https.so)" = "644 root:root" ]
check "binaries stripped" bash -c "! readelf -S '$R/usr/bin/dpproxy' '$R/usr/bin/dpctl' '$R/usr/bin/dpconform' '$R/usr/lib/dpproxy/dpproxy-https.so' | grep -q symtab"
check "copyright file" grep -q "^License: Apache-2.0" "$R/usr/share/doc/dpproxy/copyright"
check "changelog names this version" bash -c "zcat '$R/usr/share/doc/dpproxy/changelog.gz' | head -1 | grep -qF '($VERSION)'"
for page in dpproxy dpctl dpconform; do
  check "manual page $page(1)" bash -c "zcat '$R/usr/share/man/man1/$page.1.gz' | grep -q '^.TH'"
done
check "config is a conffile" grep -qx /etc/dpproxy/dpproxy.yaml "$R/var/lib/dpkg/info/dpproxy.conffiles"
check "unit runs /usr/bin/dpproxy" grep -q '^ExecStart=/usr/bin/dpproxy ' "$R/lib/systemd/system/dpproxy.service"
check "unit is Type=notify with a watchdog" grep -q '^WatchdogSec=' "$R/lib/systemd/system/dpproxy.service"
check "installed dpproxy runs" grep -q "^dpproxy 0\." <<<"$("$R/usr/bin/dpproxy" --version)"
check "installed dpctl runs" "$R/usr/bin/dpctl" --help >/dev/null
check "installed dpconform lists its scenarios" grep -q "^  registers " \
  <<<"$("$R/usr/bin/dpconform" --list)"
# The installed dpproxy finds the installed HTTPS module: a DRA start whose
# kubeconfig holds a CA that is not a certificate is refused by the module's
# check of it (not with "the HTTPS module is not installed").
cat >"$R/kubeconfig" <<'KC'
current-context: node
contexts: [{name: node, context: {cluster: c, user: u}}]
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9", certificate-authority-data: "bm90IGEgY2VydA=="}}]
users: [{name: u, user: {token: t}}]
KC
run="$(mktemp -d /tmp/dpp-deb.XXXXXX)"  # short: sockets are made under it
dra="$(timeout 60 env -u RUNFILES_DIR "$R/usr/bin/dpproxy" --kubelet_api=dra \
  --dra_driver=gpu.example.com --node_name=n --kubeconfig="$R/kubeconfig" \
  --kubelet_root="$run/k" --plugin_dir="$run/p" --state_dir="$run/s" \
  --status_file="$run/status.json" --metrics_address= 2>&1)"
rm -rf "$run"
check "installed dpproxy loads the installed HTTPS module" \
  grep -q "certificate-authority-data holds no PEM certificate" <<<"$dra"

# systemd-analyze checks the unit; its binary path must exist, so a copy
# points at the installed one.
unit_dir="$(mktemp -d "${TEST_TMPDIR:-/tmp}/unit.XXXXXX")"
sed "s|/usr/bin/dpproxy|$R/usr/bin/dpproxy|" "$R/lib/systemd/system/dpproxy.service" \
  >"$unit_dir/dpproxy.service"
if command -v systemd-analyze >/dev/null; then
  out="$(systemd-analyze verify "$unit_dir/dpproxy.service" 2>&1)"
  check "systemd-analyze verify accepts the unit" [ -z "$out" ]
  [ -z "$out" ] || echo "$out"
  # The sandbox: an exposure of 4.0 or less ("OK" in systemd's words).
  security="$(systemd-analyze security --offline=true "$unit_dir/dpproxy.service" 2>&1 | tail -n 1)"
  check "systemd-analyze security: exposure 4.0 or less ($security)" \
    systemd-analyze security --offline=true --threshold=40 "$unit_dir/dpproxy.service"
else
  fail "systemd-analyze is not installed (tools/dev setup installs systemd)"
fi

# An operator's edit of the conffile survives reinstalling the package.
echo "# edited by the operator" >>"$R/etc/dpproxy/dpproxy.yaml"
check "dpkg reinstalls it" install
check "the edited conffile is kept" grep -q "edited by the operator" "$R/etc/dpproxy/dpproxy.yaml"
# Removal takes the binaries, keeps the conffile and the state.
echo state >"$R/var/lib/dpproxy/state.pb"
check "dpkg removes it" dpkg --root="$R" --force-script-chrootless --log=/dev/null -r dpproxy \
  >/dev/null 2>&1
check "binaries removed" [ ! -e "$R/usr/bin/dpproxy" ]
check "conffile kept on removal" [ -e "$R/etc/dpproxy/dpproxy.yaml" ]
check "state kept on removal" [ -e "$R/var/lib/dpproxy/state.pb" ]
check "dpkg purges it" dpkg --root="$R" --force-script-chrootless --log=/dev/null -P dpproxy \
  >/dev/null 2>&1
check "conffile gone on purge" [ ! -e "$R/etc/dpproxy/dpproxy.yaml" ]
check "state gone on purge" [ ! -e "$R/var/lib/dpproxy" ]

finish
