#!/usr/bin/env bash
# dpproxy's OCI image (tools/image:dpproxy_image): what every image of ours
# holds (oci_checks.sh), dpctl and the HTTPS module beside dpproxy, and the
# binaries run in a chroot of the unpacked layer (with its own libraries
# only), as root and as nobody.
set -uo pipefail

IMAGE="$TEST_SRCDIR/dpproxy/tools/image/dpproxy-image.tar"
W="$(mktemp -d "${TEST_TMPDIR:-/tmp}/image.XXXXXX")"
source "$TEST_SRCDIR/dpproxy/tests/testing/checks.sh"

source "$TEST_SRCDIR/dpproxy/tests/image/oci_checks.sh"
verify_image "$IMAGE" dpproxy /usr/local/bin/dpproxy
check "dpctl in the layer" [ -x "$W/root/usr/local/bin/dpctl" ]
check "dpctl is stripped" bash -c "! readelf -S '$W/root/usr/local/bin/dpctl' | grep -q '\.symtab'"
check "the state directory" [ -d "$W/root/var/lib/dpproxy" ]
# Only what an HTTPS client of one API server needs: none of libcurl's
# other protocols and their libraries.
for lib in libcurl libgssapi_krb5 libldap libgnutls libssh2 librtmp; do
  check "no $lib in the image" bash -c "! find '$W/root' -name '$lib*' | grep -q ."
done

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
