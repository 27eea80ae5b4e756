# Shared settings for the local-cluster scripts (sourced, not run).
# Everything lives under the work tree: binaries under .cache (kept between
# runs, keyed by version), the running cluster under .run (removed by cluster.sh down).

set -euo pipefail

E2E_CLUSTER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$E2E_CLUSTER_DIR/../.." && pwd)

K8S_VERSION=${K8S_VERSION:-v1.37.0}
ETCD_VERSION=${ETCD_VERSION:-v3.5.21}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.1.4}
NFD_VERSION=${NFD_VERSION:-v0.18.3}
NVIDIA_VERSION=${NVIDIA_VERSION:-v0.19.0}

CACHE_DIR=${E2E_CLUSTER_CACHE:-$E2E_CLUSTER_DIR/.cache}
RUN_DIR=${E2E_CLUSTER_RUN:-$E2E_CLUSTER_DIR/.run}

K8S_BIN=$CACHE_DIR/bin/kubernetes-$K8S_VERSION
KUBEADM_BIN=$CACHE_DIR/bin/kubeadm-$K8S_VERSION
ETCD_BIN=$CACHE_DIR/bin/etcd-$ETCD_VERSION
CONTAINERD_BIN=$CACHE_DIR/bin/containerd-$CONTAINERD_VERSION
NFD_BIN=$CACHE_DIR/bin/nfd-$NFD_VERSION
NVIDIA_BIN=$CACHE_DIR/bin/nvidia-$NVIDIA_VERSION

# The previous release, for the upgrade lane (TestUpgrade): any commit or tag
# git resolves; until v0.1.0 is tagged, commit c596a2d, the build v0.1.0
# follows (docs/development.md, Releases). build.sh previous builds it from git with its own make image into
# $CACHE_DIR/previous/<full commit>/: src/ (its tree, the chart among it),
# image/gpu-device-plugin-image.tar, version (its image tag).
PREVIOUS_RELEASE=${PREVIOUS_RELEASE:-c596a2d}

# previous_commit prints PREVIOUS_RELEASE's full commit, or fails saying why.
previous_commit() {
	git -C "$REPO_ROOT" rev-parse --verify --quiet "$PREVIOUS_RELEASE^{commit}" ||
		die "PREVIOUS_RELEASE=$PREVIOUS_RELEASE is not a commit of $REPO_ROOT (a shallow clone? git fetch --unshallow, or set PREVIOUS_RELEASE to a commit or tag it has)"
}

# Loopback ports. Kubernetes' own defaults, except etcd's, so an etcd
# already on the machine does not clash.
APISERVER_PORT=${APISERVER_PORT:-6443}
ETCD_CLIENT_PORT=${ETCD_CLIENT_PORT:-23790}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-23800}
KUBELET_PORT=${KUBELET_PORT:-10250}
KUBELET_HEALTHZ_PORT=${KUBELET_HEALTHZ_PORT:-10248}

NODE_NAME=${NODE_NAME:-e2e-node}

# Images the node has; nothing is ever pulled.
PAUSE_IMAGE=localhost/e2e/pause:v1
PROBE_IMAGE=localhost/e2e/probe:v1
# Node Feature Discovery (the node-labels lane), from build.sh nfd.
NFD_MASTER_IMAGE=localhost/e2e/nfd-master:$NFD_VERSION
NFD_WORKER_IMAGE=localhost/e2e/nfd-worker:$NFD_VERSION
# NVIDIA's device plugin and GFD (the migration lane), from build.sh nvidia.
NVIDIA_PLUGIN_IMAGE=localhost/e2e/nvidia-device-plugin:$NVIDIA_VERSION
NVIDIA_GFD_IMAGE=localhost/e2e/gpu-feature-discovery:$NVIDIA_VERSION

log() { printf '%s %s: %s\n' "$(date +%T)" "${LOG_TAG:-e2e-cluster}" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The plugin's image as `make image` tags it: IMAGE_REPO:VERSION.
PLUGIN_REPO=localhost/gpu-device-plugin
PLUGIN_TAG=e2e
PLUGIN_IMAGE=$PLUGIN_REPO:$PLUGIN_TAG

# The host sysctls a kubelet sets when protectKernelDefaults is off; a
# privileged container's /proc/sys does not keep them from the host, so the
# kind node's kubelet sets them too. save_sysctls FILE records them before a
# cluster starts, restore_sysctls FILE puts them back after.
KUBELET_SYSCTLS="vm/overcommit_memory kernel/panic kernel/panic_on_oops"
save_sysctls() {
	local s
	for s in $KUBELET_SYSCTLS; do echo "$s $(cat "/proc/sys/$s")"; done >"$1"
}
restore_sysctls() {
	local s v
	[ -f "$1" ] || return 0
	while read -r s v; do echo "$v" >"/proc/sys/$s"; done <"$1"
}

# suite_env KEY=VALUE...: the settings file suite.sh reads, values quoted.
suite_env() {
	local kv
	for kv in "$@"; do printf '%s=%q\n' "${kv%%=*}" "${kv#*=}"; done
}
