#!/usr/bin/env bash
# The Debian package (tools/package:dpproxy_deb): its control fields, then
# installed with dpkg into a scratch root: files and modes, the conffile
# (an operator's edit survives reinstalling), the binaries run from the
# tree, systemd-analyze accepts the unit, and removal keeps the conffile
# and the state directory's contents.
set -uo pipefail

DEB="$TEST_SRCDIR/dpproxy/tools/package/dpproxy.deb"
R="$(mktemp -d "${TEST_TMPDIR:-/tmp}/root.XXXXXX")"
source "$TEST_SRCDIR/dpproxy/tests/testing/checks.sh"
field() { dpkg-deb -f "$DEB" "$1"; }

check "package name" [ "$(field Package)" = dpproxy ]
check "version" [ "$(field Version)" = 0.7.0 ]
check "architecture" [ "$(field Architecture)" = "$(dpkg --print-architecture)" ]
depends="$(field Depends)"
for p in libgrpc++1.51 libprotobuf32 libsystemd0 libuv1; do
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
check "unit 0644" [ "$(mode /lib/systemd/system/dpproxy.service)" = "644 root:root" ]
check "config 0644" [ "$(mode /etc/dpproxy/dpproxy.yaml)" = "644 root:root" ]
check "state dir 0700" [ "$(mode /var/lib/dpproxy)" = "700 root:root" ]
check "config is a conffile" grep -qx /etc/dpproxy/dpproxy.yaml "$R/var/lib/dpkg/info/dpproxy.conffiles"
check "unit runs /usr/bin/dpproxy" grep -q '^ExecStart=/usr/bin/dpproxy ' "$R/lib/systemd/system/dpproxy.service"
check "unit is Type=notify with a watchdog" grep -q '^WatchdogSec=' "$R/lib/systemd/system/dpproxy.service"
check "installed dpproxy runs" grep -q "^dpproxy 0\." <<<"$("$R/usr/bin/dpproxy" --version)"
check "installed dpctl runs" "$R/usr/bin/dpctl" --help >/dev/null

# systemd-analyze checks the unit; its binary path must exist, so a copy
# points at the installed one.
unit_dir="$(mktemp -d "${TEST_TMPDIR:-/tmp}/unit.XXXXXX")"
sed "s|/usr/bin/dpproxy|$R/usr/bin/dpproxy|" "$R/lib/systemd/system/dpproxy.service" \
  >"$unit_dir/dpproxy.service"
if command -v systemd-analyze >/dev/null; then
  out="$(systemd-analyze verify "$unit_dir/dpproxy.service" 2>&1)"
  check "systemd-analyze verify accepts the unit" [ -z "$out" ]
  [ -z "$out" ] || echo "$out"
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

finish
