#!/usr/bin/env bash
# The OCI image (tools/image:dpproxy_image): the layout's index, manifest,
# config and layer verify against their digests and sizes; the config's
# diff_id is the uncompressed layer's digest; the config names the
# entrypoint and labels; and the binaries in the unpacked layer run in a
# chroot of it (with their own libraries only), as root and as nobody.
set -uo pipefail

IMAGE="$TEST_SRCDIR/dpproxy/tools/image/dpproxy-image.tar"
W="$(mktemp -d "${TEST_TMPDIR:-/tmp}/image.XXXXXX")"
source "$TEST_SRCDIR/dpproxy/tests/testing/checks.sh"

mkdir -p "$W/oci" "$W/root"
check "the tarball unpacks" tar -xf "$IMAGE" -C "$W/oci" || finish
check "oci-layout" grep -q '"imageLayoutVersion":"1.0.0"' "$W/oci/oci-layout"
blob() { echo "$W/oci/blobs/sha256/${1#sha256:}"; }
# The descriptor of `media` in a JSON file: "sha256:HEX SIZE".
descriptor() {
  grep -o "\"mediaType\":\"$2\",\"digest\":\"sha256:[0-9a-f]*\",\"size\":[0-9]*" "$1" | head -1 |
    sed 's/.*"digest":"\(sha256:[0-9a-f]*\)","size":\([0-9]*\)/\1 \2/'
}
verify() {  # name, "sha256:HEX SIZE"
  local digest="${2% *}" size="${2#* }" file
  file="$(blob "$digest")"
  if [ ! -f "$file" ]; then fail "$1: blob $digest missing"; return 1; fi
  check "$1 digest" [ "sha256:$(sha256sum "$file" | cut -d' ' -f1)" = "$digest" ]
  check "$1 size" [ "$(stat -c %s "$file")" = "$size" ]
}
m="$(descriptor "$W/oci/index.json" application/vnd.oci.image.manifest.v1+json)"
check "index names a manifest" [ -n "$m" ] || finish
verify manifest "$m" || finish
manifest="$(blob "${m% *}")"
c="$(descriptor "$manifest" application/vnd.oci.image.config.v1+json)"
l="$(descriptor "$manifest" application/vnd.oci.image.layer.v1.tar+gzip)"
verify config "$c" || finish
verify layer "$l" || finish
config="$(blob "${c% *}")"
layer="$(blob "${l% *}")"
diff_id="sha256:$(gzip -dc "$layer" | sha256sum | cut -d' ' -f1)"
check "diff_id is the uncompressed layer's digest" grep -q "\"diff_ids\":\[\"$diff_id\"\]" "$config"
check "entrypoint" grep -q '"Entrypoint":\["/usr/local/bin/dpproxy"\]' "$config"
check "version label" grep -q '"org.opencontainers.image.version":"0\.' "$config"
check "revision label" grep -q '"org.opencontainers.image.revision":"[0-9a-z-]\+"' "$config"
check "created label (RFC 3339)" \
  grep -q '"org.opencontainers.image.created":"[0-9]\{4\}-[0-9]\{2\}-[0-9]\{2\}T[0-9:]\{8\}Z"' "$config"
check "source label" grep -q '"org.opencontainers.image.source":"https\?://' "$config"
check "licenses label" grep -q '"org.opencontainers.image.licenses":"Apache-2.0"' "$config"
check "os and architecture" grep -q "\"architecture\":\"$(dpkg --print-architecture)\",\"os\":\"linux\"" "$config"

check "the layer unpacks" tar -xzf "$layer" -C "$W/root" || finish
check "dpproxy in the layer" [ -x "$W/root/usr/local/bin/dpproxy" ]
check "dpctl in the layer" [ -x "$W/root/usr/local/bin/dpctl" ]
check "/tmp is 1777" [ "$(stat -c %a "$W/root/tmp")" = 1777 ]
check "an unprivileged user exists" grep -q '^nobody:x:65534:' "$W/root/etc/passwd"
for b in dpproxy dpctl; do
  check "$b is stripped" bash -c "! readelf -S '$W/root/usr/local/bin/$b' | grep -q '\.symtab'"
done
check "dpproxy's copyright" grep -q "License: Apache-2.0" "$W/root/usr/share/doc/dpproxy/copyright"
check "the Apache licence text" test -s "$W/root/usr/share/common-licenses/Apache-2.0"
# Every library in the image came with its package's copyright file
# (dpproxy's own HTTPS module with dpproxy's).
missing=""
while read -r lib; do
  pkg="$( (dpkg -S "${lib#$W/root}" 2>/dev/null || dpkg -S "$(readlink -f "${lib#$W/root}")" 2>/dev/null || true) |
    head -n 1 | cut -d: -f1)"
  [[ -n "$pkg" && -s "$W/root/usr/share/doc/$pkg/copyright" ]] || missing+=" ${lib#$W/root}"
done < <(find "$W/root" -name '*.so*' -type f -not -path '*/usr/local/lib/dpproxy/*')
check "a copyright file for every library (missing:${missing:- none})" [ -z "$missing" ]
# Only what an HTTPS client of one API server needs: none of libcurl's
# other protocols and their libraries.
for lib in libcurl libgssapi_krb5 libldap libgnutls libssh2 librtmp; do
  check "no $lib in the image" bash -c "! find '$W/root' -name '$lib*' | grep -q ."
done

if [ "$(id -u)" != 0 ]; then
  fail "the chroot checks need root (CI runs as root)"
  finish
fi
mkdir -p "$W/root/proc"
# A mount namespace of its own with /proc inside the chroot, as a runtime
# gives a container; nothing from the host's libraries is visible.
in_image() { unshare --mount --pid --fork --mount-proc="$W/root/proc" chroot "$@"; }
help="$(in_image "$W/root" /usr/local/bin/dpproxy --help 2>&1)"
check "dpproxy --help runs in the image" grep -q "bridges Kubernetes device-plugin API versions" <<<"$help"
check "dpctl --help runs in the image" in_image "$W/root" /usr/local/bin/dpctl --help >/dev/null 2>&1
version="$(in_image --userspec=65534:65534 "$W/root" /usr/local/bin/dpproxy --version 2>&1)"
check "dpproxy runs as nobody" grep -q "^dpproxy 0\." <<<"$version"
# The HTTPS module and every library it needs are in the image: the
# image's own dynamic loader resolves them all.
check "the HTTPS module in the layer" [ -f "$W/root/usr/local/lib/dpproxy/dpproxy-https.so" ]
interp="$(readelf -l "$W/root/usr/local/bin/dpproxy" | sed -n 's/.*interpreter: \(.*\)]/\1/p')"
module_libs="$(in_image "$W/root" "$interp" --list /usr/local/lib/dpproxy/dpproxy-https.so 2>&1)"
check "its libraries resolve in the image" bash -c "! grep -q 'not found' <<<\"\$1\"" _ "$module_libs"
check "... OpenSSL among them" grep -q "libssl.so" <<<"$module_libs"
finish
