#!/usr/bin/env bash
# tools/image/build_image.sh: an OCI image of dpproxy and dpctl, built offline
# (no registry, no container engine) as an OCI image-layout tarball that
# `podman load`, `ctr image import` and `skopeo copy oci-archive:...` accept.
#
#   build_image.sh DPPROXY DPCTL HTTPS_MODULE VERSION COPYRIGHT OUT.tar
#
# One layer: /usr/local/bin/{dpproxy,dpctl} and
# /usr/local/lib/dpproxy/dpproxy-https.so (the API client's TLS, loaded on
# use), stripped, and exactly the shared libraries they load (ldd's
# closure, the dynamic loader included);
# the copyright file of every Debian package those libraries come from, and
# of dpproxy itself (COPYRIGHT), under /usr/share/doc/PACKAGE/, with the
# licence texts they refer to under /usr/share/common-licenses/;
# /etc/passwd and /etc/group with root and nobody; an empty /tmp (1777).
# Reproducible: sorted entries, mtime 0, owner 0, gzip without a name or
# time. Labels: version, revision (the commit `dpproxy --version` names),
# licenses, created (SOURCE_DATE_EPOCH, else the epoch) and source
# (DPPROXY_SOURCE, else the placeholder https://example.invalid/dpproxy).
# Runs as root by default: in both modes it creates sockets in the
# kubelet's root-owned directories. Nothing else in it needs root:
# `--user 65534` works where the mounted directories allow, and dpctl runs
# as anyone.
set -euo pipefail

dpproxy="$1"; dpctl="$2"; module="$3"; version="$4"; copyright="$5"; out="$6"
work="$(mktemp -d "${TMPDIR:-/tmp}/dpproxy-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fs="$work/fs"; blobs="$work/oci/blobs/sha256"
mkdir -p "$fs/usr/local/bin" "$fs/usr/local/lib/dpproxy" "$fs/etc" "$fs/tmp" "$fs/var/lib/dpproxy" "$blobs"
chmod 1777 "$fs/tmp"
install -m 0755 "$dpproxy" "$fs/usr/local/bin/dpproxy"
install -m 0755 "$dpctl" "$fs/usr/local/bin/dpctl"
install -m 0644 "$module" "$fs/usr/local/lib/dpproxy/dpproxy-https.so"
strip --strip-unneeded "$fs/usr/local/bin/dpproxy" "$fs/usr/local/bin/dpctl" \
  "$fs/usr/local/lib/dpproxy/dpproxy-https.so"
install -D -m 0644 "$copyright" "$fs/usr/share/doc/dpproxy/copyright"
for b in "$dpproxy" "$dpctl" "$module"; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
done | sort -u >"$work/libs"
while read -r lib; do
  mkdir -p "$fs$(dirname "$lib")"
  cp -L "$lib" "$fs$lib"
  chmod 0755 "$fs$lib"
  # Its package's copyright file goes with it (LGPL and GPL libraries are
  # among them): a library no package owns, or one without it, stops the build.
  pkg="$( (dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null || true) |
    head -n 1 | cut -d: -f1)"
  if [[ -z "$pkg" || ! -f "/usr/share/doc/$pkg/copyright" ]]; then
    echo "build_image.sh: no copyright file for $lib (package: ${pkg:-none})" >&2
    exit 1
  fi
  install -D -m 0644 "/usr/share/doc/$pkg/copyright" "$fs/usr/share/doc/$pkg/copyright"
done <"$work/libs"
# The licence texts those files name.
cat "$fs"/usr/share/doc/*/copyright |
  grep -o '/usr/share/common-licenses/[A-Za-z0-9+-]*\(\.[0-9]\+\)*' | sort -u |
  while read -r text; do
    if [[ -f "$text" ]]; then install -D -m 0644 "$text" "$fs$text"; fi
  done
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$fs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$fs/etc/group"

sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$fs" -cf "$work/layer.tar" .
diff_id="$(sha "$work/layer.tar")"
gzip -n -9 <"$work/layer.tar" >"$work/layer.tar.gz"
layer="$(sha "$work/layer.tar.gz")"; layer_size="$(size "$work/layer.tar.gz")"
mv "$work/layer.tar.gz" "$blobs/$layer"

arch="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
# "dpproxy 0.8.0 (commit 1a2b3c4d5e6f)"
revision="$("$dpproxy" --version | sed -n 's/.*(commit \(.*\))$/\1/p')"
created="$(date -u -d "@${SOURCE_DATE_EPOCH:-0}" +%Y-%m-%dT%H:%M:%SZ)"
source_url="${DPPROXY_SOURCE:-https://example.invalid/dpproxy}"
cat >"$work/config.json" <<CONFIG
{"architecture":"$arch","os":"linux","config":{"Entrypoint":["/usr/local/bin/dpproxy"],"Env":["PATH=/usr/local/bin:/usr/bin:/bin"],"WorkingDir":"/","Labels":{"org.opencontainers.image.title":"dpproxy","org.opencontainers.image.description":"Bridges Kubernetes device-plugin API versions","org.opencontainers.image.version":"$version","org.opencontainers.image.revision":"$revision","org.opencontainers.image.created":"$created","org.opencontainers.image.source":"$source_url","org.opencontainers.image.licenses":"Apache-2.0"}},"rootfs":{"type":"layers","diff_ids":["sha256:$diff_id"]},"history":[{"created_by":"tools/image/build_image.sh","created":"$created","comment":"dpproxy and dpctl with the shared libraries they load and their copyright files"}]}
CONFIG
config="$(sha "$work/config.json")"; config_size="$(size "$work/config.json")"
mv "$work/config.json" "$blobs/$config"

cat >"$work/manifest.json" <<MANIFEST
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$config","size":$config_size},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:$layer","size":$layer_size}]}
MANIFEST
manifest="$(sha "$work/manifest.json")"; manifest_size="$(size "$work/manifest.json")"
mv "$work/manifest.json" "$blobs/$manifest"

printf '{"imageLayoutVersion":"1.0.0"}\n' >"$work/oci/oci-layout"
cat >"$work/oci/index.json" <<INDEX
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$manifest","size":$manifest_size,"annotations":{"org.opencontainers.image.ref.name":"$version","io.containerd.image.name":"localhost/dpproxy:$version"}}]}
INDEX
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/oci" -cf "$out" .
