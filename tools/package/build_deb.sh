#!/usr/bin/env bash
# tools/package/build_deb.sh: the dpproxy Debian package, built with dpkg-deb.
#
#   build_deb.sh DPPROXY DPCTL DPCONFORM HTTPS_MODULE UNIT CONFIG VERSION CHANGELOG.md COPYRIGHT OUT.deb
#
# Contents:
#   /usr/bin/dpproxy, /usr/bin/dpctl, /usr/bin/dpconform 0755, stripped
#   /usr/lib/dpproxy/dpproxy-https.so                   0644, stripped: the API
#                                                       client's TLS, loaded on use
#   /usr/share/man/man1/dpproxy.1.gz, dpctl.1.gz,
#     dpconform.1.gz                                    from their --help (help2man)
#   /usr/share/doc/dpproxy/copyright                    machine-readable (DEP-5; tools/package/copyright)
#   /usr/share/doc/dpproxy/changelog.gz                 this release, from CHANGELOG.md
#   /lib/systemd/system/dpproxy.service                 0644 (ExecStart=/usr/bin/dpproxy)
#   /etc/dpproxy/dpproxy.yaml                           0644, a conffile
# Maintainer scripts: postinst makes /var/lib/dpproxy (0700: state, plugin
# socket) and has systemd reread the unit; prerm stops the service when the
# package is removed (not when it is upgraded: dpproxy hands over in place,
# docs/upgrade.md); postrm has systemd forget the unit, and on purge removes
# /var/lib/dpproxy.
# Depends: the Debian packages that own the shared libraries the binaries
# and the module name (readelf's NEEDED, located with ldd, owners from dpkg -S).
# DPPROXY_MAINTAINER overrides the Maintainer field.
set -euo pipefail

dpproxy="$1"; dpctl="$2"; dpconform="$3"; module="$4"; unit="$5"; config="$6"; version="$7"
changelog="$8"; copyright="$9"; out="${10}"
maintainer="${DPPROXY_MAINTAINER:-dpproxy developers <dpproxy-developers@example.org>}"
root="$(mktemp -d "${TMPDIR:-/tmp}/dpproxy-deb.XXXXXX")"
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"  # the package's / (mktemp made it 0700)

doc="$root/usr/share/doc/dpproxy"
install -d -m 0755 "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/dpproxy" \
  "$root/lib/systemd/system" "$root/etc/dpproxy" "$doc" "$root/usr/share/man/man1"
install -m 0755 "$dpproxy" "$root/usr/bin/dpproxy"
install -m 0755 "$dpctl" "$root/usr/bin/dpctl"
install -m 0755 "$dpconform" "$root/usr/bin/dpconform"
install -m 0644 "$module" "$root/usr/lib/dpproxy/dpproxy-https.so"
strip --strip-unneeded --remove-section=.comment --remove-section=.note \
  "$root/usr/bin/dpproxy" "$root/usr/bin/dpctl" "$root/usr/bin/dpconform" \
  "$root/usr/lib/dpproxy/dpproxy-https.so"
sed 's|/usr/local/bin/dpproxy|/usr/bin/dpproxy|g' "$unit" >"$root/lib/systemd/system/dpproxy.service"
chmod 0644 "$root/lib/systemd/system/dpproxy.service"
install -m 0644 "$config" "$root/etc/dpproxy/dpproxy.yaml"

# Manual pages, from each tool's own --help and --version.
manpage() {
  local bin="$1" name="$2" section="$root/usr/share/man/man1/$(basename "$1").1"
  help2man --no-info --no-discard-stderr --name="$name" "$bin" >"$section"
  gzip -9n "$section"
  chmod 0644 "$section.gz"
}
manpage "$root/usr/bin/dpproxy" "bridges Kubernetes device-plugin API versions"
manpage "$root/usr/bin/dpctl" "inspects dpproxy's durable state"
manpage "$root/usr/bin/dpconform" "tests a device plugin against every kubelet generation"

# The changelog of a native package: this release's entries from
# CHANGELOG.md ("## VERSION (DATE)", then "- " items).
date="$(sed -n "s/^## $version (\([0-9-]*\)).*/\1/p" "$changelog")"
if [[ -z "$date" ]]; then
  echo "build_deb.sh: $changelog has no '## $version (YYYY-MM-DD)' section" >&2
  exit 1
fi
{
  echo "dpproxy ($version) unstable; urgency=medium"
  echo
  awk -v v="## $version " 'index($0, v) == 1 {on = 1; next} /^## / {on = 0} on' "$changelog" |
    awk '/^- / {if (item != "") print item; item = substr($0, 3); next}
         /^  / {sub(/^ +/, ""); item = item " " $0; next}
         END {if (item != "") print item}' |
    while IFS= read -r item; do
      printf '%s\n' "$item" | fold -s -w 74 | sed 's/ *$//; 1s/^/  * /; 2,$s/^/    /'
    done
  echo
  echo " -- $maintainer  $(date -R -u -d "$date 12:00")"
} >"$doc/changelog"
gzip -9n "$doc/changelog"
chmod 0644 "$doc/changelog.gz"

install -m 0644 "$copyright" "$doc/copyright"

# One package per shared library the binaries name (their ELF NEEDED
# entries, found where ldd finds them), without versions: the build
# machine's are the ones tested.
libs() {
  local bin="$1" so
  for so in $(readelf -d "$bin" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
    ldd "$bin" | awk -v so="$so" '$1 == so && $3 ~ /^\// {print $3}'
  done
}
depends="$(for b in "$dpproxy" "$dpctl" "$dpconform" "$module"; do libs "$b"; done | sort -u |
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
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Section: admin
Priority: optional
Depends: $depends
Description: bridges Kubernetes device-plugin API versions
 dpproxy sits between the kubelet and vendor device plugins, speaking
 whatever device-plugin API each side speaks (v1alpha of Kubernetes 1.9,
 v1beta1 from 1.10, the plugin watcher, DRA), translating every call and
 keeping allocations safe on disk across kubelet, plugin and dpproxy
 restarts. dpconform, the conformance suite for device plugins, comes
 with it.
CONTROL
echo "/etc/dpproxy/dpproxy.yaml" >"$root/DEBIAN/conffiles"
# The scripts act under $DPKG_ROOT, so an install into another root
# (dpkg --root, --force-script-chrootless) never touches this machine's.
cat >"$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  # The state directory: dpproxy's own, private.
  install -d -m 0700 "${DPKG_ROOT:-}/var/lib/dpproxy"
fi
# The unit is new or changed: systemd rereads it (only where systemd runs).
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
POSTINST
cat >"$root/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
# Removed (not upgraded): the service stops with its binary. An upgrade
# leaves it running; the new binary takes over in place (docs/upgrade.md).
if [ "$1" = remove ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ] &&
   command -v deb-systemd-invoke >/dev/null; then
  deb-systemd-invoke stop dpproxy.service >/dev/null || true
fi
PRERM
cat >"$root/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
# Purged: dpproxy's state (allocations, device lists) goes too.
if [ "$1" = purge ]; then
  rm -rf "${DPKG_ROOT:-}/var/lib/dpproxy"
fi
POSTRM
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
dpkg-deb --root-owner-group -Zxz --build "$root" "$out" >/dev/null
