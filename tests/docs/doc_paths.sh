#!/usr/bin/env bash
# tests/docs/doc_paths.sh ROOT [FILE...]: every repository path the docs
# name exists. Reads README.md, docs/*.md and the chart's README under ROOT (or the FILEs
# given, relative to ROOT), finds the paths they name under the
# repository's top folders (`proxy/...`, `tools/...`, a link
# `](../deploy/...)`, a link to another doc), and prints each one that does
# not exist. A test or binary may be named as Bazel names it (without .cc
# or .sh), a generated .pb.h by its .proto. Exits 1 if any is missing, 0 if
# none.
#
#   tests/docs/doc_paths.sh .
set -uo pipefail

root="$1"; shift
cd "$root" || exit 2
files=("$@")
[[ ${#files[@]} -gt 0 ]] || files=(README.md docs/*.md deploy/helm/dpproxy/README.md)
tops='proxy|backends|tools|tests|docs|deploy|proto|third_party|\.ci'
report="$(for f in "${files[@]}"; do
  dir="$(dirname "$f")"
  {
    # Paths under a top folder, at a word start (not inside a URL or an
    # absolute path): `tools/dev`, //tests/proxy:proxy_test, proxy/core/.
    grep -oE "(^|[][ \`(\"'])/?/?($tops)/[A-Za-z0-9_./:+-]*" "$f" |
      sed -E "s/^[][ \`(\"']//; s|^//||" | grep -vE '^/' |
      sed -E 's/:.*$//; s|/\.\.\.$||; s/[.,;)]+$//'
    # Relative links to files: ](configuration.md), ](../deploy/x.yaml#y).
    grep -oE '\]\([^)#:]+(#[^)]*)?\)' "$f" | sed -E 's/^\]\(//; s/[#)].*$//' |
      grep -vE '^(https?|mailto):' | while read -r rel; do
        [[ -n "$rel" ]] && printf '%s\n' "$(realpath -m --relative-to=. "$dir/$rel")"
      done
  } | sort -u | while read -r p; do
    [[ -z "$p" || -e "$p" ]] && continue
    # A test or binary by its Bazel name (tests/proxy/storm_test), and a
    # file protoc generates (proto/v1beta1/api.grpc.pb.h) by its .proto.
    [[ -e "$p.cc" || -e "$p.sh" ]] && continue
    proto="$(sed -E 's/(_mock)?\.(grpc\.)?pb\.(h|cc)$/.proto/' <<<"$p")"
    [[ "$proto" != "$p" && -e "$proto" ]] && continue
    echo "$f names $p, which does not exist"
  done
done)"
[[ -z "$report" ]] && exit 0
printf '%s\n' "$report"
exit 1
