#!/usr/bin/env bash
# tools/package/build_deb.sh: the dpproxy Debian package, built with dpkg-deb.
#
#   build_deb.sh DPPROXY DPCTL UNIT CONFIG VERSION OUT.deb
#
# Contents:
#   /usr/bin/dpproxy, /usr/bin/dpctl                    0755
#   /lib/systemd/system/dpproxy.service                 0644 (ExecStart=/usr/bin/dpproxy)
#   /etc/dpproxy/dpproxy.yaml                           0644, a conffile
#   /var/lib/dpproxy/                                   0700 (state, plugin socket)
# Depends: the Debian packages that own the shared libraries the binaries
# name (readelf's NEEDED, located with ldd, owners from dpkg -S).
set -euo pipefail

dpproxy="$1"; dpctl="$2"; unit="$3"; config="$4"; version="$5"; out="$6"
root="$(mktemp -d "${TMPDIR:-/tmp}/dpproxy-deb.XXXXXX")"
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"  # the package's / (mktemp made it 0700)

install -d -m 0755 "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/dpproxy"
install -d -m 0700 "$root/var/lib/dpproxy"
install -m 0755 "$dpproxy" "$root/usr/bin/dpproxy"
install -m 0755 "$dpctl" "$root/usr/bin/dpctl"
sed 's|/usr/local/bin/dpproxy|/usr/bin/dpproxy|g' "$unit" >"$root/lib/systemd/system/dpproxy.service"
chmod 0644 "$root/lib/systemd/system/dpproxy.service"
install -m 0644 "$config" "$root/etc/dpproxy/dpproxy.yaml"

# One package per shared library the binaries name (their ELF NEEDED
# entries, found where ldd finds them), without versions: the build
# machine's are the ones tested.
libs() {
  local bin="$1" so
  for so in $(readelf -d "$bin" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
    ldd "$bin" | awk -v so="$so" '$1 == so && $3 ~ /^\// {print $3}'
  done
}
depends="$(for b in "$dpproxy" "$dpctl"; do libs "$b"; done | sort -u |
  while read -r lib; do
    dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null || true
  done | cut -d: -f1 | sort -u | paste -sd, - | sed 's/,/, /g')"
if [[ -z "$depends" ]]; then
  echo "build_deb.sh: no package owns the libraries the binaries load (is this Debian?)" >&2
  exit 1
fi

cat >"$root/DEBIAN/control" <<CONTROL
Package: dpproxy
Version: $version
Architecture: $(dpkg --print-architecture)
Maintainer: dpproxy developers <dpproxy@localhost>
Section: admin
Priority: optional
Depends: $depends
Description: bridges Kubernetes device-plugin API versions
 dpproxy sits between the kubelet and vendor device plugins, speaking
 whatever device-plugin API each side speaks (v1alpha of Kubernetes 1.9,
 v1beta1 from 1.10, the plugin watcher), translating every call and keeping
 allocations safe on disk across kubelet, plugin and dpproxy restarts.
CONTROL
echo "/etc/dpproxy/dpproxy.yaml" >"$root/DEBIAN/conffiles"
cat >"$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
# The unit is new or changed: systemd rereads it (only where systemd runs).
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
POSTINST
chmod 0755 "$root/DEBIAN/postinst"
dpkg-deb --root-owner-group -Zxz --build "$root" "$out" >/dev/null
