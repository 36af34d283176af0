#!/usr/bin/env bash
# tools/image/build_image.sh: an OCI image built offline (no registry, no
# container engine) as an OCI image-layout tarball that `podman load`,
# `ctr image import` and `skopeo copy oci-archive:...` accept.
#
#   build_image.sh --name=NAME --description=TEXT --version=VERSION \
#     --copyright=FILE --entrypoint=PATH --out=OUT.tar [--dir=PATH...] SRC=DEST...
#
# One layer: each SRC at DEST; the files Debian did not install are ours,
# stripped, with our copyright file (COPYRIGHT) under
# /usr/share/doc/NAME/copyright; the files Debian installed (a shell, a
# util-linux program) come with their package's copyright file. Exactly
# the shared libraries they all load (ldd's closure, the dynamic loader
# included), each with its package's copyright file under
# /usr/share/doc/PACKAGE/, and the licence texts those files refer to
# under /usr/share/common-licenses/; /etc/passwd and /etc/group with root
# and nobody; an empty /tmp (1777) and each --dir (0755).
# Reproducible: sorted entries, mtime 0, owner 0, gzip without a name or
# time. Labels: title, description, version, revision (the commit the
# entrypoint's --version names), licenses, created (SOURCE_DATE_EPOCH,
# else the epoch) and source (DPPROXY_SOURCE, else the placeholder
# https://example.invalid/dpproxy). The tag is localhost/NAME:VERSION.
set -euo pipefail

name=""; description=""; version=""; copyright=""; entrypoint=""; out=""; files=(); dirs=()
for arg in "$@"; do
  case "$arg" in
    --name=*) name="${arg#*=}" ;;
    --description=*) description="${arg#*=}" ;;
    --version=*) version="${arg#*=}" ;;
    --copyright=*) copyright="${arg#*=}" ;;
    --entrypoint=*) entrypoint="${arg#*=}" ;;
    --out=*) out="${arg#*=}" ;;
    --dir=/*) dirs+=("${arg#*=}") ;;
    --*) echo "build_image.sh: unknown flag $arg" >&2; exit 2 ;;
    *=/*) files+=("$arg") ;;
    *) echo "build_image.sh: $arg is not SRC=/DEST" >&2; exit 2 ;;
  esac
done
for required in name description version copyright entrypoint out; do
  if [[ -z "${!required}" ]]; then echo "build_image.sh: --$required is required" >&2; exit 2; fi
done
if [[ ${#files[@]} -eq 0 ]]; then echo "build_image.sh: no SRC=DEST" >&2; exit 2; fi

work="$(mktemp -d "${TMPDIR:-/tmp}/image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fs="$work/fs"; blobs="$work/oci/blobs/sha256"
mkdir -p "$fs/etc" "$fs/tmp" "$blobs"
chmod 1777 "$fs/tmp"
for d in "${dirs[@]}"; do mkdir -p "$fs$d"; done

# The Debian package that installed `path`, if any.
package_of() {
  (dpkg -S "$1" 2>/dev/null || dpkg -S "$(readlink -f "$1")" 2>/dev/null || true) |
    head -n 1 | cut -d: -f1
}
# The package's copyright file goes with what it installed (LGPL and GPL
# libraries are among them); a package without one stops the build.
package_copyright() {  # path, package
  if [[ -z "$2" || ! -f "/usr/share/doc/$2/copyright" ]]; then
    echo "build_image.sh: no copyright file for $1 (package: ${2:-none})" >&2
    exit 1
  fi
  install -D -m 0644 "/usr/share/doc/$2/copyright" "$fs/usr/share/doc/$2/copyright"
}

: >"$work/elves"
for f in "${files[@]}"; do
  src="${f%%=*}"; dest="${f#*=}"
  pkg="$(package_of "$src")"
  mkdir -p "$fs$(dirname "$dest")"
  if [[ -x "$src" && ! -d "$src" ]]; then mode=0755; else mode=0644; fi
  install -m "$mode" "$src" "$fs$dest"
  if [[ -n "$pkg" ]]; then
    package_copyright "$src" "$pkg"
  elif head -c 4 "$src" | grep -q 'ELF'; then
    strip --strip-unneeded "$fs$dest"
  fi
  if head -c 4 "$src" | grep -q 'ELF'; then echo "$src" >>"$work/elves"; fi
done
install -D -m 0644 "$copyright" "$fs/usr/share/doc/$name/copyright"
while read -r b; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
done <"$work/elves" | sort -u >"$work/libs"
while read -r lib; do
  mkdir -p "$fs$(dirname "$lib")"
  cp -L "$lib" "$fs$lib"
  chmod 0755 "$fs$lib"
  package_copyright "$lib" "$(package_of "$lib")"
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
revision="$("$fs$entrypoint" --version | sed -n 's/.*(commit \(.*\))$/\1/p')"
created="$(date -u -d "@${SOURCE_DATE_EPOCH:-0}" +%Y-%m-%dT%H:%M:%SZ)"
source_url="${DPPROXY_SOURCE:-https://example.invalid/dpproxy}"
cat >"$work/config.json" <<CONFIG
{"architecture":"$arch","os":"linux","config":{"Entrypoint":["$entrypoint"],"Env":["PATH=/usr/local/bin:/usr/bin:/bin"],"WorkingDir":"/","Labels":{"org.opencontainers.image.title":"$name","org.opencontainers.image.description":"$description","org.opencontainers.image.version":"$version","org.opencontainers.image.revision":"$revision","org.opencontainers.image.created":"$created","org.opencontainers.image.source":"$source_url","org.opencontainers.image.licenses":"Apache-2.0"}},"rootfs":{"type":"layers","diff_ids":["sha256:$diff_id"]},"history":[{"created_by":"tools/image/build_image.sh","created":"$created","comment":"$name with the shared libraries it loads and their copyright files"}]}
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
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$manifest","size":$manifest_size,"annotations":{"org.opencontainers.image.ref.name":"$version","io.containerd.image.name":"localhost/$name:$version"}}]}
INDEX
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/oci" -cf "$out" .
