#!/usr/bin/env bash
# The end-to-end suite on kind, with every step but the cluster's creation
# shared with the local cluster (e2e/cluster): the same fixture, images,
# chart values and suite.
#
#   kind.sh up     write the fixture, build the images, create the cluster
#                  (cluster.yaml), load the images, write .run/suite.env
#   kind.sh down   delete the cluster and .run
#
# Needs docker (or podman with KIND_EXPERIMENTAL_PROVIDER), root for the
# fixture's device nodes, gcc and Go. kind is the one on PATH, else built
# from the Go module proxy into e2e/cluster/.cache (KIND_VERSION).
# KIND_NODE_IMAGE picks the node image (a v1.34 kindest/node by default).
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"

KIND_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KIND_RUN=$KIND_DIR/.run
CLUSTER=${KIND_CLUSTER_NAME:-gpu-e2e}
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.34.0}
KIND_VERSION=${KIND_VERSION:-v0.30.0}
NODE=$CLUSTER-control-plane
ENGINE=${KIND_EXPERIMENTAL_PROVIDER:-docker}

# kind: the one on PATH, else one built once from the module proxy.
kind() {
	if type -P kind >/dev/null; then
		command kind "$@"
		return
	fi
	local bin=$CACHE_DIR/bin/kind-$KIND_VERSION
	if [ ! -x "$bin/kind" ]; then
		log "building kind $KIND_VERSION"
		GOBIN=$bin GOFLAGS= go install "sigs.k8s.io/kind@$KIND_VERSION"
	fi
	"$bin/kind" "$@"
}

up() {
	command -v "$ENGINE" >/dev/null || die "$ENGINE is not installed"
	[ "$(id -u)" = 0 ] || die "needs root (the fixture's device nodes)"
	kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
	rm -rf "$KIND_RUN" && mkdir -p "$KIND_RUN/device-plugins" "$KIND_RUN/cdi"
	log "fixture: mock NVML on the ${E2E_PROFILE:-dgx-h100} profile"
	(cd "$REPO_ROOT/e2e" && go run ./cluster/fixture -profile "${E2E_PROFILE:-dgx-h100}" -nics -o "$KIND_RUN/fixture")
	"$E2E_CLUSTER_DIR/images.sh" "$KIND_RUN/images"
	sed -e "s#@FIXTURE@#$KIND_RUN/fixture#g" -e "s#@DEVICE_PLUGIN_DIR@#$KIND_RUN/device-plugins#g" \
		-e "s#@CDI_DIR@#$KIND_RUN/cdi#g" -e "s#^name: .*#name: $CLUSTER#" \
		"$KIND_DIR/cluster.yaml" >"$KIND_RUN/cluster.yaml"
	kind create cluster --config "$KIND_RUN/cluster.yaml" --image "$KIND_NODE_IMAGE" \
		--kubeconfig "$KIND_RUN/kubeconfig" --wait 5m
	# The single node is the control plane: let the suite's pods on it.
	"$ENGINE" exec "$NODE" kubectl --kubeconfig /etc/kubernetes/admin.conf \
		taint nodes --all node-role.kubernetes.io/control-plane- || true
	for tar in "$KIND_RUN/images/probe.tar" "$KIND_RUN/images/plugin/gpu-device-plugin-image.tar"; do
		kind load image-archive "$tar" --name "$CLUSTER"
	done
	suite_env \
		KUBECONFIG="$KIND_RUN/kubeconfig" \
		E2E_NODE="$NODE" \
		E2E_FIXTURE="$KIND_RUN/fixture" \
		E2E_DEVICE_PLUGIN_DIR="$KIND_RUN/device-plugins" \
		E2E_CDI_SPEC_DIR="$KIND_RUN/cdi" \
		E2E_CDI_DIR="$KIND_RUN/cdi" \
		E2E_PLUGIN_IMAGE="$PLUGIN_IMAGE" \
		E2E_PROBE_IMAGE="$PROBE_IMAGE" \
		E2E_KUBELET_RESTART="$ENGINE exec $NODE systemctl restart kubelet" \
		E2E_REPORT_DIR="$KIND_DIR/.report" \
		>"$KIND_RUN/suite.env"
	log "kind cluster $CLUSTER up; KUBECONFIG=$KIND_RUN/kubeconfig"
}

down() {
	kind delete cluster --name "$CLUSTER" || true
	rm -rf "$KIND_RUN"
}

case "${1:-}" in
up) up ;;
down) down ;;
*) die "usage: $0 up|down" ;;
esac
