# tests/image/oci_checks.sh: sourced by the image tests (after
# tests/testing/checks.sh), with W set to a scratch directory.
#
#   verify_image IMAGE NAME ENTRYPOINT
#
# Checks what every image of ours holds: the layout's index, manifest,
# config and layer verify against their digests and sizes; the config's
# diff_id is the uncompressed layer's digest; the config names the
# entrypoint, the tag and the labels; our binaries are stripped; every
# library came with its package's copyright file, and ours with our own.
# Leaves the unpacked layer in $W/root and the config's path in $config.
# `in_image [chroot options] ROOT COMMAND...` runs a command in a chroot of
# it with a mount namespace, /proc and /dev, as a runtime gives a
# container: nothing from the host's libraries is visible.

blob() { echo "$W/oci/blobs/sha256/${1#sha256:}"; }
# The descriptor of `media` in a JSON file: "sha256:HEX SIZE".
descriptor() {
  grep -o "\"mediaType\":\"$2\",\"digest\":\"sha256:[0-9a-f]*\",\"size\":[0-9]*" "$1" | head -1 |
    sed 's/.*"digest":"\(sha256:[0-9a-f]*\)","size":\([0-9]*\)/\1 \2/'
}
verify_blob() {  # name, "sha256:HEX SIZE"
  local digest="${2% *}" size="${2#* }" file
  file="$(blob "$digest")"
  if [ ! -f "$file" ]; then fail "$1: blob $digest missing"; return 1; fi
  check "$1 digest" [ "sha256:$(sha256sum "$file" | cut -d' ' -f1)" = "$digest" ]
  check "$1 size" [ "$(stat -c %s "$file")" = "$size" ]
}

verify_image() {  # image, name, entrypoint
  local image="$1" name="$2" entrypoint="$3" m c l manifest layer diff_id
  mkdir -p "$W/oci" "$W/root"
  check "the tarball unpacks" tar -xf "$image" -C "$W/oci" || finish
  check "oci-layout" grep -q '"imageLayoutVersion":"1.0.0"' "$W/oci/oci-layout"
  check "the tag" grep -q "\"io.containerd.image.name\":\"localhost/$name:0\.[0-9.]*\"" \
    "$W/oci/index.json"
  m="$(descriptor "$W/oci/index.json" application/vnd.oci.image.manifest.v1+json)"
  check "index names a manifest" [ -n "$m" ] || finish
  verify_blob manifest "$m" || finish
  manifest="$(blob "${m% *}")"
  c="$(descriptor "$manifest" application/vnd.oci.image.config.v1+json)"
  l="$(descriptor "$manifest" application/vnd.oci.image.layer.v1.tar+gzip)"
  verify_blob config "$c" || finish
  verify_blob layer "$l" || finish
  config="$(blob "${c% *}")"
  layer="$(blob "${l% *}")"
  diff_id="sha256:$(gzip -dc "$layer" | sha256sum | cut -d' ' -f1)"
  check "diff_id is the uncompressed layer's digest" grep -q "\"diff_ids\":\[\"$diff_id\"\]" "$config"
  check "entrypoint" grep -q "\"Entrypoint\":\[\"$entrypoint\"\]" "$config"
  check "title label" grep -q "\"org.opencontainers.image.title\":\"$name\"" "$config"
  check "version label" grep -q '"org.opencontainers.image.version":"0\.' "$config"
  check "revision label" grep -q '"org.opencontainers.image.revision":"[0-9a-z-]\+"' "$config"
  check "created label (RFC 3339)" \
    grep -q '"org.opencontainers.image.created":"[0-9]\{4\}-[0-9]\{2\}-[0-9]\{2\}T[0-9:]\{8\}Z"' "$config"
  check "source label" grep -q '"org.opencontainers.image.source":"https\?://' "$config"
  check "licenses label" grep -q '"org.opencontainers.image.licenses":"Apache-2.0"' "$config"
  check "os and architecture" grep -q "\"architecture\":\"$(dpkg --print-architecture)\",\"os\":\"linux\"" "$config"

  check "the layer unpacks" tar -xzf "$layer" -C "$W/root" || finish
  check "$entrypoint in the layer" [ -x "$W/root$entrypoint" ] || finish
  check "$entrypoint is stripped" bash -c "! readelf -S '$W/root$entrypoint' | grep -q '\.symtab'"
  check "/tmp is 1777" [ "$(stat -c %a "$W/root/tmp")" = 1777 ]
  check "an unprivileged user exists" grep -q '^nobody:x:65534:' "$W/root/etc/passwd"
  check "$name's copyright" grep -q "License: Apache-2.0" "$W/root/usr/share/doc/$name/copyright"
  check "the Apache licence text" test -s "$W/root/usr/share/common-licenses/Apache-2.0"
  # Every library in the image came with its package's copyright file
  # (dpproxy's own HTTPS module with dpproxy's).
  local missing="" lib pkg
  while read -r lib; do
    pkg="$( (dpkg -S "${lib#$W/root}" 2>/dev/null || dpkg -S "$(readlink -f "${lib#$W/root}")" 2>/dev/null || true) |
      head -n 1 | cut -d: -f1)"
    [[ -n "$pkg" && -s "$W/root/usr/share/doc/$pkg/copyright" ]] || missing+=" ${lib#$W/root}"
  done < <(find "$W/root" -name '*.so*' -type f -not -path '*/usr/local/lib/dpproxy/*')
  check "a copyright file for every library (missing:${missing:- none})" [ -z "$missing" ]
  if [ "$(id -u)" != 0 ]; then
    fail "the chroot checks need root (CI runs as root)"
    finish
  fi
  mkdir -p "$W/root/proc"
}

in_image() {  # [chroot options] ROOT COMMAND...
  local opts=()
  while [[ "$1" == --* ]]; do opts+=("$1"); shift; done
  local root="$1"; shift
  mkdir -p "$root/dev"
  # The runtime's /dev (a plugin's command starts with /dev/null as stdin).
  unshare --mount --pid --fork --mount-proc="$root/proc" \
    bash -c 'mount --bind /dev "$0/dev" && exec chroot "$@"' "$root" "${opts[@]}" "$root" "$@"
}
