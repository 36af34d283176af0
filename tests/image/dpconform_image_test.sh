#!/usr/bin/env bash
# dpconform's OCI image (tools/image:dpconform_image): what every image of
# ours holds (oci_checks.sh), the shell and prlimit that run a plugin's
# command, and a grid run in a chroot of the unpacked layer against the
# sample plugin put in as an author's CI puts theirs (its binary and the
# libraries it loads), writing JUnit where the author mounted a directory.
set -uo pipefail

IMAGE="$TEST_SRCDIR/dpproxy/tools/image/dpconform-image.tar"
PLUGIN="$TEST_SRCDIR/dpproxy/tools/sample_plugin/sample_plugin"
W="$(mktemp -d "${TEST_TMPDIR:-/tmp}/image.XXXXXX")"
source "$TEST_SRCDIR/dpproxy/tests/testing/checks.sh"
source "$TEST_SRCDIR/dpproxy/tests/image/oci_checks.sh"

verify_image "$IMAGE" dpconform /usr/local/bin/dpconform
check "/bin/sh in the layer" [ -x "$W/root/bin/sh" ]
check "prlimit in the layer" [ -x "$W/root/usr/bin/prlimit" ]
check "dash's copyright" test -s "$W/root/usr/share/doc/dash/copyright"
check "util-linux's copyright" test -s "$W/root/usr/share/doc/util-linux/copyright"

list="$(in_image "$W/root" /usr/local/bin/dpconform --list 2>&1)"
check "dpconform --list runs in the image" grep -q "allocate-restart" <<<"$list"
check "dpconform runs as nobody" \
  in_image --userspec=65534:65534 "$W/root" /usr/local/bin/dpconform --version

# A plugin's command runs under the image's shell and prlimit: the file-size
# limit (64 MiB, in dash's 512-byte blocks) is in force, and the cell names
# the command's output.
out="$(in_image "$W/root" /usr/local/bin/dpconform --resource=example.com/gpu \
  --plugin='echo fsize=$(ulimit -f); exit 3' --kubelets=1.37 --scenarios=registers 2>&1)"
check "a plugin's command runs under prlimit's limit" grep -q "fsize=131072" <<<"$out"

# The author's plugin and the libraries it loads, as their CI mounts them.
mkdir -p "$W/root/plugin" "$W/root/out"
chmod 0777 "$W/root/out"
cp "$PLUGIN" "$W/root/plugin/sample_plugin"
ldd "$PLUGIN" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' |
  while read -r lib; do
    if [ ! -e "$W/root$lib" ]; then mkdir -p "$W/root$(dirname "$lib")"; cp -L "$lib" "$W/root$lib"; fi
  done
# As nobody: dpconform needs no privileges (its kubelets live under /tmp).
in_image --userspec=65534:65534 "$W/root" /usr/local/bin/dpconform --resource=example.com/gpu \
  --plugin='/plugin/sample_plugin --quiet --resource=example.com/gpu --kubelet_socket={kubelet_socket}' \
  --kubelets=1.37,1.25,1.10 --scenarios=registers,device-list,allocate,plugin-restart,allocate-restart \
  --junit=/out/junit.xml >"$W/grid.txt" 2>&1
status=$?
check "the grid passes in the image as nobody (status $status: $(tail -n 3 "$W/grid.txt" | tr '\n' ' '))" [ "$status" = 0 ]
check "JUnit written where the author mounted" grep -q '<testsuites name="dpconform" tests="15" failures="0"' "$W/root/out/junit.xml"
finish
