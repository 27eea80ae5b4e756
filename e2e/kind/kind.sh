#!/usr/bin/env bash
# The end-to-end suite on kind, with every step but the cluster's creation
# shared with the local cluster (e2e/cluster): the same fixture, images,
# chart values and suite.
#
#   kind.sh up     start Docker if none answers, get the node image, write the
#                  fixture, build the images, create the cluster (cluster.yaml),
#                  load the images, write .run/suite.env
#   kind.sh down   delete the cluster, stop the Docker daemon up started,
#                  remove .run
#
# KIND_NODE_IMAGE picks the node image, the one switch between machines:
#   local     (default) built here by node-image.sh from Debian's packages and
#             e2e/cluster's builds, Kubernetes $K8S_VERSION; nothing pulled
#   upstream  the kindest/node image kind $KIND_VERSION pins (needs a network)
#   any other value is an image reference, used as is.
#
# Docker: the daemon DOCKER_HOST (or the default socket) names if it answers;
# else this script installs Debian's docker.io if dockerd is missing and runs
# a daemon of its own under .run/docker (its own socket, data and bridge; no
# iptables rules, no IP forwarding, no outbound NAT), stopped by down. On a
# machine whose bounding set lacks CAP_SYS_RESOURCE that daemon runs
# containers through runc-nosysres (./runc-nosysres, built into .run), and
# containerd on the node is told to keep OOM scores at or above its own.
# kind is built once from its Go module at $KIND_VERSION into the cache.
LOG_TAG=e2e-kind
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"

KIND_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KIND_RUN=$KIND_DIR/.run
CLUSTER=${KIND_CLUSTER_NAME:-gpu-e2e}
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-local}
KIND_VERSION=${KIND_VERSION:-v0.32.0}
NODE=$CLUSTER-control-plane
DOCKERD_DIR=$KIND_RUN/docker
LOCAL_NODE_IMAGE=localhost/gpu-e2e/kind-node:$K8S_VERSION

# kind: built once from the Go module proxy into the cache.
kind() {
	local bin=$CACHE_DIR/bin/kind-$KIND_VERSION
	if [ ! -x "$bin/kind" ]; then
		log "building kind $KIND_VERSION"
		GOBIN=$bin.tmp GOFLAGS= go install "sigs.k8s.io/kind@$KIND_VERSION" && mv "$bin.tmp" "$bin"
	fi
	"$bin/kind" "$@"
}

# no_sys_resource: this machine cannot grant CAP_SYS_RESOURCE (bit 24).
no_sys_resource() {
	local bnd
	bnd=$(awk '/^CapBnd:/ { print $2 }' /proc/self/status)
	(((0x$bnd >> 24 & 1) == 0))
}

# docker_up: use the Docker daemon that answers, else start our own.
docker_up() {
	if [ -S "$DOCKERD_DIR/docker.sock" ]; then
		export DOCKER_HOST=unix://$DOCKERD_DIR/docker.sock
	fi
	if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
		return
	fi
	if ! command -v dockerd >/dev/null; then
		log "installing Docker (Debian's docker.io)"
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >&2 ||
			die "installing docker.io failed; install Docker, or point DOCKER_HOST at a daemon"
	fi
	mkdir -p "$DOCKERD_DIR"
	local conf='{}'
	if no_sys_resource; then
		log "no CAP_SYS_RESOURCE here: the e2e's Docker daemon runs containers through runc-nosysres"
		(cd "$REPO_ROOT/e2e" && CGO_ENABLED=0 go build -o "$DOCKERD_DIR/runc-nosysres" ./kind/runc-nosysres)
		conf=$(printf '{"runtimes": {"nosysres": {"path": "%s"}}, "default-runtime": "nosysres"}' "$DOCKERD_DIR/runc-nosysres")
	fi
	echo "$conf" >"$DOCKERD_DIR/daemon.json"
	# Leave the daemon's OOM score alone (lowering it needs CAP_SYS_RESOURCE);
	# Docker 25 and later have no such flag and leave it alone anyway.
	local oom=()
	# grep -c reads all of the help: -q would stop early and, under pipefail,
	# dockerd's SIGPIPE would read as "no such flag".
	dockerd --help 2>&1 | grep -c -- --oom-score-adjust >/dev/null && oom=(--oom-score-adjust=0)
	log "starting dockerd ($(dockerd --version)) in $DOCKERD_DIR"
	# Its own everything, and no changes to the host's network beyond the
	# kind network's bridge: no iptables rules, no forwarding, no docker0.
	setsid dockerd --config-file "$DOCKERD_DIR/daemon.json" --data-root "$DOCKERD_DIR/data" \
		--exec-root "$DOCKERD_DIR/exec" --pidfile "$DOCKERD_DIR/dockerd.pid" \
		-H "unix://$DOCKERD_DIR/docker.sock" --bridge=none --iptables=false --ip-forward=false \
		--ip-masq=false "${oom[@]}" </dev/null >"$DOCKERD_DIR/dockerd.log" 2>&1 &
	export DOCKER_HOST=unix://$DOCKERD_DIR/docker.sock
	local i
	for i in $(seq 60); do
		docker info >/dev/null 2>&1 && return
		kill -0 $! 2>/dev/null || break
		sleep 0.5
	done
	tail -20 "$DOCKERD_DIR/dockerd.log" >&2
	die "dockerd did not come up (log: $DOCKERD_DIR/dockerd.log)"
}

# docker_down: stop the daemon docker_up started, if it did.
docker_down() {
	local pid
	pid=$(cat "$DOCKERD_DIR/dockerd.pid" 2>/dev/null) || return 0
	if kill -0 "$pid" 2>/dev/null; then
		log "stopping dockerd"
		kill "$pid"
		local i
		for i in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
		kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
	fi
	# What a killed daemon may leave mounted under its directories.
	grep -o " $DOCKERD_DIR/[^ ]*" /proc/self/mounts | sort -r | xargs -r umount -l 2>/dev/null || true
}

# node_image: the image reference for kind's --image, built and imported
# here for "local"; empty for "upstream" (kind's pinned default).
node_image() {
	case "$KIND_NODE_IMAGE" in
	upstream) ;;
	local)
		local t0=$SECONDS
		"$KIND_DIR/node-image.sh" "$KIND_RUN/node.tar"
		docker import --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
			--change 'ENV container=docker' "$KIND_RUN/node.tar" "$LOCAL_NODE_IMAGE" >/dev/null
		rm -f "$KIND_RUN/node.tar"
		log "node image $LOCAL_NODE_IMAGE ready in $((SECONDS - t0))s"
		echo "$LOCAL_NODE_IMAGE"
		;;
	*) echo "$KIND_NODE_IMAGE" ;;
	esac
}

up() {
	[ "$(id -u)" = 0 ] || die "needs root (the fixture's device nodes)"
	[ ! -d "$KIND_RUN" ] || down
	mkdir -p "$KIND_RUN/kubelet/device-plugins" "$KIND_RUN/kubelet/pod-resources" \
		"$KIND_RUN/kubelet/plugins" "$KIND_RUN/cdi" "$KIND_RUN/devinfo"
	trap 'log "up failed; kind.sh down (make e2e-kind-down) cleans up"' EXIT
	docker_up
	save_sysctls "$KIND_RUN/sysctl.saved"
	local image t0
	image=$(node_image)
	log "fixture: mock NVML on the ${E2E_PROFILE:-dgx-h100} profile"
	(cd "$REPO_ROOT/e2e" && go run ./cluster/fixture -profile "${E2E_PROFILE:-dgx-h100}" -nics -o "$KIND_RUN/fixture")
	"$E2E_CLUSTER_DIR/images.sh" "$KIND_RUN/images"
	sed -e "s#@FIXTURE@#$KIND_RUN/fixture#g" -e "s#@KUBELET_DIR@#$KIND_RUN/kubelet#g" \
		-e "s#@CDI_DIR@#$KIND_RUN/cdi#g" -e "s#@DEVINFO_DIR@#$KIND_RUN/devinfo#g" \
		-e "s#^name: .*#name: $CLUSTER#" "$KIND_DIR/cluster.yaml" >"$KIND_RUN/cluster.yaml"
	if no_sys_resource; then
		cat >>"$KIND_RUN/cluster.yaml" <<-'EOF'
			  # This machine cannot grant CAP_SYS_RESOURCE: no OOM score below containerd's own.
			  - |-
			    [plugins."io.containerd.grpc.v1.cri"]
			      restrict_oom_score_adj = true
		EOF
	fi
	t0=$SECONDS
	kind create cluster --config "$KIND_RUN/cluster.yaml" ${image:+--image "$image"} \
		--kubeconfig "$KIND_RUN/kubeconfig" --wait 5m
	log "cluster created in $((SECONDS - t0))s"
	for tar in "$KIND_RUN/images/probe.tar" "$KIND_RUN/images/plugin/gpu-device-plugin-image.tar"; do
		kind load image-archive "$tar" --name "$CLUSTER"
	done
	# The suite runs `docker exec` through the same daemon.
	local docker_env=
	[ -n "${DOCKER_HOST:-}" ] && docker_env="env DOCKER_HOST=$DOCKER_HOST "
	suite_env \
		KUBECONFIG="$KIND_RUN/kubeconfig" \
		E2E_NODE="$NODE" \
		E2E_FIXTURE="$KIND_RUN/fixture" \
		E2E_DEVICE_PLUGIN_DIR="$KIND_RUN/kubelet/device-plugins" \
		E2E_CDI_SPEC_DIR="$KIND_RUN/cdi" \
		E2E_CDI_DIR="$KIND_RUN/cdi" \
		E2E_DEVINFO_DIR="$KIND_RUN/devinfo" \
		E2E_NODE_API_SERVER=127.0.0.1:6443 \
		E2E_NODE_ADDRESS="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$NODE")" \
		E2E_PLUGIN_IMAGE="$PLUGIN_IMAGE" \
		E2E_PROBE_IMAGE="$PROBE_IMAGE" \
		E2E_KUBELET_RESTART="${docker_env}docker exec $NODE systemctl restart kubelet" \
		E2E_REPORT_DIR="$KIND_DIR/.report" \
		E2E_NFD_SKIP="kind lane: no Node Feature Discovery here; the local cluster (make e2e-cluster) runs the node-labels lane, nothing of which differs on kind, and NFD's 60 s rescan plus 60 s at rest would add ~2.5 min" \
		E2E_UPGRADE_SKIP="kind lane: the upgrade lane runs on the local cluster (make e2e-cluster), where the previous release's image is built and imported; nothing of an upgrade differs on kind" \
		>"$KIND_RUN/suite.env"
	trap - EXIT
	log "kind cluster $CLUSTER up; KUBECONFIG=$KIND_RUN/kubeconfig"
}

down() {
	if [ -S "$DOCKERD_DIR/docker.sock" ]; then
		export DOCKER_HOST=unix://$DOCKERD_DIR/docker.sock
	fi
	if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
		mkdir -p "$KIND_DIR/.report"
		kind export logs "$KIND_DIR/.report/logs" --name "$CLUSTER" >/dev/null 2>&1 || true
		kind delete cluster --name "$CLUSTER" || true
		# kind leaves its network (a bridge on the host); ours goes, a
		# user's daemon keeps it for their other clusters.
		[ -f "$DOCKERD_DIR/dockerd.pid" ] && { docker network rm kind >/dev/null 2>&1 || true; }
	fi
	docker_down
	restore_sysctls "$KIND_RUN/sysctl.saved"
	rm -rf "$KIND_RUN"
}

case "${1:-}" in
up) up ;;
down) down ;;
*) die "usage: $0 up|down" ;;
esac
