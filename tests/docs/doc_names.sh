#!/usr/bin/env bash
# tests/docs/doc_names.sh ROOT [FILE...]: every command-line flag and every
# test the docs name exists. Reads README.md, docs/*.md and the chart's
# README under ROOT (or the FILEs given, relative to ROOT) and prints:
#   - each `--flag` that no source of ours defines or passes (gflags and
#     Python flags accept - and _ alike, so both spellings count); a flag on
#     a line that runs Bazel is Bazel's own and not looked for, nor are the
#     flags of `podman run` or `docker run` up to its first word that is not
#     a flag (the image's command's flags, after it, are);
#   - each GoogleTest name (`SuiteTest.Name`, or `SuiteTest.Prefix*` as a
#     filter) with no TEST, TEST_F or TEST_P of that suite and name under
#     tests/.
# Exits 1 if any is unknown, 0 if none.
#
#   tests/docs/doc_names.sh .
set -uo pipefail

root="$1"; shift
cd "$root" || exit 2
files=("$@")
[[ ${#files[@]} -gt 0 ]] || files=(README.md docs/*.md deploy/helm/dpproxy/README.md)
sources=(proxy backends tools tests deploy .ci)
report="$(for f in "${files[@]}"; do
  # A command continued with a backslash counts as one line.
  sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' "$f" | grep -vE '(^|[ `])bazel (test|build|run|query) ' |
    sed -E 's/(^|[ `])(podman|docker) run( -[^ ]+)* [^ -][^ ]*/\1\2-run IMAGE/' |
    grep -oE "(^|[][ \`(\"'=])--[a-z][a-z0-9_-]+" | sed -E "s/^[][ \`(\"'=]//" | sort -u |
    while read -r flag; do
      name="${flag#--}"
      under="${name//-/_}" dash="${name//_/-}"
      grep -rqE --exclude-dir=testdata -- "(DEFINE_[a-z0-9]+\(|\"|--)($under|$dash)\b" \
        "${sources[@]}" 2>/dev/null && continue
      echo "$f names the flag $flag, which nothing defines"
    done
  # A name ending in * is a filter: some test must start with it.
  grep -oE "\b[A-Z][A-Za-z0-9]*Test\.[A-Z][A-Za-z0-9_]+\*?" "$f" | sort -u | while read -r t; do
    suite="${t%%.*}" name="${t#*.}" rest='\)'
    [[ "$name" == *'*' ]] && name="${name%'*'}" rest='[A-Za-z0-9_]*\)'
    grep -rqE "TEST(_F|_P)?\($suite, *$name$rest" tests --include=*.cc && continue
    echo "$f names the test $t, which does not exist"
  done
done)"
[[ -z "$report" ]] && exit 0
printf '%s\n' "$report"
exit 1
