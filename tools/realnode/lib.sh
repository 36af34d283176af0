# Shared by the real-node scripts (sourced, not run).
# shellcheck shell=bash

RN_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tools/realnode/versions.env
source "$RN_HERE/versions.env"

RN_CACHE="${DPPROXY_REALNODE_CACHE:-$HOME/.cache/dpproxy-realnode}"
# The packages of k8s.io/kubernetes each release builds: the node's parts,
# and the e2e tests' sample device plugin (a real third-party peer).
RN_KUBERNETES_COMMANDS="cmd/kubelet cmd/kube-apiserver cmd/kube-scheduler cmd/kube-controller-manager cmd/kubectl test/images/sample-device-plugin"

rn_log() { printf '%s\n' "realnode: $*" >&2; }
rn_die() { printf '%s\n' "realnode: error: $*" >&2; exit 1; }

rn_require_go() {
  if ! command -v go >/dev/null; then
    if [[ -x /usr/local/go/bin/go ]]; then
      export PATH="/usr/local/go/bin:$PATH"
    else
      rn_die "go: no Go toolchain (the real node is built with Go >= 1.26 from /usr/local/go or PATH)"
    fi
  fi
  # Another Go (Debian's golang-go) may come first on PATH; the
  # Kubernetes releases need this one.
  if [[ -x /usr/local/go/bin/go ]]; then export PATH="/usr/local/go/bin:$PATH"; fi
}

# "1.37.2" -> "1.37"
rn_minor() { local v="$1"; echo "${v%.*}"; }

rn_newest_release() { echo "${KUBERNETES_RELEASES%% *}"; }

# A release named by minor ("1.36") or in full ("1.36.3") -> the pinned one.
rn_release_of() {
  local want="$1" r
  for r in $KUBERNETES_RELEASES; do
    if [[ "$r" == "$want" || "$(rn_minor "$r")" == "$want" ]]; then echo "$r"; return 0; fi
  done
  rn_die "Kubernetes $want is not pinned in tools/realnode/versions.env (pinned: $KUBERNETES_RELEASES)"
}

# The commands release $1 builds (KUBERNETES_COMMANDS_BY_RELEASE, else all).
rn_kubernetes_commands() {
  local minor pair
  minor="$(rn_minor "$1")"
  for pair in ${KUBERNETES_COMMANDS_BY_RELEASE:-}; do
    if [[ "${pair%%=*}" == "$minor" ]]; then echo "${pair#*=}" | tr , ' '; return 0; fi
  done
  echo "$RN_KUBERNETES_COMMANDS"
}

rn_part_version() {
  case "$1" in
    containerd) echo "$CONTAINERD_VERSION" ;;
    runc) echo "$RUNC_VERSION" ;;
    cni) echo "$CNI_PLUGINS_VERSION" ;;
    etcd) echo "$ETCD_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
    podresources) echo "$PODRESOURCES_API_VERSION" ;;
    *) rn_die "unknown part: $1" ;;
  esac
}

rn_part_module() {
  case "$1" in
    containerd) echo github.com/containerd/containerd/v2 ;;
    runc) echo github.com/opencontainers/runc ;;
    cni) echo github.com/containernetworking/plugins ;;
    etcd) echo go.etcd.io/etcd/server/v3 ;;
    helm) echo helm.sh/helm/v3 ;;
    podresources) echo k8s.io/kubelet ;;
    *) rn_die "unknown part: $1" ;;
  esac
}

rn_part_packages() {
  case "$1" in
    containerd)
      echo github.com/containerd/containerd/v2/cmd/containerd \
           github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
           github.com/containerd/containerd/v2/cmd/ctr ;;
    runc) echo github.com/opencontainers/runc ;;
    cni) echo github.com/containernetworking/plugins/plugins/main/loopback \
              github.com/containernetworking/plugins/plugins/main/bridge \
              github.com/containernetworking/plugins/plugins/ipam/host-local ;;
    etcd) echo go.etcd.io/etcd/server/v3 ;;
    helm) echo helm.sh/helm/v3/cmd/helm ;;
    # Our own client (tools/realnode/modules/podresources/main.go) of the
    # API package k8s.io/kubelet generates.
    podresources) echo k8s.io/kubelet/pkg/apis/podresources/v1 ;;
    *) rn_die "unknown part: $1" ;;
  esac
}

# Where a part's binaries are: $1 part, $2 version.
rn_bin_dir() { echo "$RN_CACHE/bin/$1-$2"; }
