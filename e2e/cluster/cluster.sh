#!/usr/bin/env bash
# A single-node Kubernetes cluster on this machine, every listener on
# 127.0.0.1, for the end-to-end suite:
#
#   cluster.sh up               start etcd, kube-apiserver, kube-controller-manager,
#                               kube-scheduler, containerd (CDI on) and the kubelet;
#                               import the images; write the suite's settings
#   cluster.sh down             stop everything and remove what up made
#   cluster.sh restart-kubelet  stop the kubelet and start it again (the suite calls it)
#   cluster.sh env              print the suite's settings (KUBECONFIG and E2E_*)
#   cluster.sh kubectl ARGS...  the built kubectl, as the cluster's admin
#   cluster.sh ctr ARGS...      the built ctr, on the cluster's containerd
#
# Every process runs in a private mount namespace in which /run, /var/lib,
# /var/log and /etc/hosts are bind mounts of directories under .run/, so
# nothing is written to the machine's own /run, /var/lib or /var/log, and
# no mount is ever visible outside: when the last process ends the
# namespace and its mounts go with it. What cannot be kept inside is
# undone by down: the kubepods cgroups, the sysctls the kubelet sets, and
# any KUBE-* iptables chains it made (when iptables is installed).
#
# Needs root, runc (apt-get install runc) and the binaries build.sh makes.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PKI=$RUN_DIR/pki
KCONF=$RUN_DIR/kubeconfig
LOGS=$RUN_DIR/logs
PIDS=$RUN_DIR/pids
FIXTURE=$RUN_DIR/fixture
REPORT_DIR=$E2E_CLUSTER_DIR/.report
IMAGES=$RUN_DIR/images
# Inside the namespace these are /run, /var/lib, /var/log.
NS_RUN=$RUN_DIR/ns/run
NS_VARLIB=$RUN_DIR/ns/var-lib
NS_VARLOG=$RUN_DIR/ns/var-log
# Node Feature Discovery's local feature folder (the node's
# /etc/kubernetes/node-feature-discovery/features.d): the namespace shares the
# machine's /etc, so the plugin (chart value nodeLabels.nfdFeaturesDir) and
# nfd-worker (a hostPath) use this one, at the same path inside and out.
NS_NFD_FEATURES=$RUN_DIR/ns/nfd-features.d
CONTAINERD_SOCK=$NS_RUN/containerd/containerd.sock
# The scale lane's API user, and the audit log that records it (and the plugin).
SCALE_USER=gpu-device-plugin-scale
# The suite's plugin: the chart's ServiceAccount of release gpu-device-plugin in kube-system.
PLUGIN_USER=system:serviceaccount:kube-system:gpu-device-plugin
AUDIT_LOG=$RUN_DIR/audit/audit.log

pid_of() { cat "$PIDS/$1.pid" 2>/dev/null || true; }
alive() { local p; p=$(pid_of "$1"); [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

# in_ns CMD...: run a command in the cluster's mount namespace.
in_ns() { nsenter --mount="/proc/$(pid_of ns)/ns/mnt" -- "$@"; }

# start NAME CMD...: a daemon in the namespace, in its own session, with
# its log in logs/NAME.log and its pid in pids/NAME.pid.
start() {
	local name=$1; shift
	nsenter --mount="/proc/$(pid_of ns)/ns/mnt" -- setsid sh -c 'echo $$ >"$0"; exec "$@"' "$PIDS/$name.pid" "$@" \
		>>"$LOGS/$name.log" 2>&1 </dev/null &
	local i
	for i in $(seq 50); do [ -s "$PIDS/$name.pid" ] && return; sleep 0.1; done
	die "$name did not start (see $LOGS/$name.log)"
}

# stop NAME...: SIGTERM to each, then SIGKILL to any left after 10 s.
stop() {
	local name p pids=()
	for name in "$@"; do
		p=$(pid_of "$name")
		[ -n "$p" ] && kill -TERM "$p" 2>/dev/null && pids+=("$p")
		rm -f "$PIDS/$name.pid"
	done
	local i
	for i in $(seq 100); do
		[ ${#pids[@]} -eq 0 ] && return
		# A zombie (its parent, up, is gone) counts as stopped.
		local left=()
		for p in "${pids[@]}"; do
			[ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" = Z ] || ! kill -0 "$p" 2>/dev/null || left+=("$p")
		done
		pids=("${left[@]}")
		sleep 0.1
	done
	kill -KILL "${pids[@]}" 2>/dev/null || true
}

# wait_for WHAT SECONDS CMD...: poll CMD until it succeeds.
wait_for() {
	local what=$1 secs=$2; shift 2
	local deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $deadline ] || die "$what not ready after ${secs}s"
		sleep 0.5
	done
}

# ---------------------------------------------------------------- certificates

# cert NAME CN O EKU [SAN]: a key and a certificate signed by the cluster CA.
cert() {
	local name=$1 cn=$2 o=$3 eku=$4 san=${5:-}
	openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key" 2>/dev/null
	openssl req -new -key "$PKI/$name.key" -subj "/CN=$cn${o:+/O=$o}" -out "$PKI/$name.csr"
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$eku"
		[ -z "$san" ] || echo "subjectAltName=$san"
	} >"$PKI/$name.ext"
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 7 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
	rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# kubeconfig NAME CERT: a kubeconfig for the apiserver with a client certificate.
kubeconfig() {
	cat >"$KCONF/$1.conf" <<-EOC
	apiVersion: v1
	kind: Config
	clusters:
	- name: e2e
	  cluster:
	    server: https://127.0.0.1:$APISERVER_PORT
	    certificate-authority: $PKI/ca.crt
	users:
	- name: $1
	  user:
	    client-certificate: $PKI/$2.crt
	    client-key: $PKI/$2.key
	contexts:
	- name: $1@e2e
	  context: {cluster: e2e, user: $1}
	current-context: $1@e2e
	EOC
}

make_pki() {
	mkdir -p "$PKI" "$KCONF"
	openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key" 2>/dev/null
	openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=e2e-cluster-ca" -days 7 -sha256 \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
		-out "$PKI/ca.crt"
	cert apiserver kube-apiserver "" serverAuth \
		"IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters clientAuth
	cert admin kubernetes-admin system:masters clientAuth
	cert controller-manager system:kube-controller-manager "" clientAuth
	cert scheduler system:kube-scheduler "" clientAuth
	cert kubelet "system:node:$NODE_NAME" system:nodes clientAuth
	# The scale lane's plugins (e2e/cluster/scale): a user of their own, so
	# the API server's audit log tells their requests from everyone else's.
	cert scale "$SCALE_USER" system:masters clientAuth
	openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key" 2>/dev/null
	openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
	kubeconfig admin admin
	kubeconfig controller-manager controller-manager
	kubeconfig scheduler scheduler
	kubeconfig kubelet kubelet
	kubeconfig scale scale
}

# The audit policy records the scale lane's user and the suite's plugin
# (the remediation lane counts its requests), their metadata only, not
# bodies, so no other client pays for it.
write_audit_policy() {
	mkdir -p "$(dirname "$AUDIT_LOG")"
	cat >"$RUN_DIR/audit-policy.yaml" <<-EOP
	apiVersion: audit.k8s.io/v1
	kind: Policy
	omitStages: [RequestReceived]
	rules:
	- level: Metadata
	  users: ["$SCALE_USER", "$PLUGIN_USER"]
	- level: None
	EOP
}

# ------------------------------------------------------------------ namespace

make_namespace() {
	mkdir -p "$NS_RUN" "$NS_VARLIB/kubelet" "$NS_VARLOG" "$PIDS" "$LOGS"
	# The node's name must resolve to loopback for the apiserver to reach
	# the kubelet (logs, exec): the kubelet refuses 127.0.0.1 as a node IP.
	{ cat /etc/hosts; echo "127.0.0.1 $NODE_NAME"; } >"$RUN_DIR/ns/hosts"
	unshare --mount --propagation private setsid sh -c 'echo $$ >"$0"; exec sleep infinity' "$PIDS/ns.pid" \
		</dev/null >/dev/null 2>&1 &
	local i
	for i in $(seq 50); do [ -s "$PIDS/ns.pid" ] && break; sleep 0.1; done
	alive ns || die "could not make a mount namespace (unshare --mount)"
	# Shared inside the namespace (new peer groups, unseen outside), so
	# the kubelet's mount propagation (HostToContainer) works.
	in_ns sh -ec "
		mount --make-rshared /
		mount --bind '$NS_RUN' /run
		mount --bind '$NS_VARLIB' /var/lib
		mount --bind '$NS_VARLOG' /var/log
		mount --bind '$RUN_DIR/ns/hosts' /etc/hosts
	"
}

# ---------------------------------------------------------------- components

start_etcd() {
	start etcd "$ETCD_BIN/etcd" --name e2e --data-dir "$RUN_DIR/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
		--unsafe-no-fsync --log-level warn
	wait_for etcd 60 curl -fsS "http://127.0.0.1:$ETCD_CLIENT_PORT/health"
}

start_apiserver() {
	write_audit_policy
	start kube-apiserver "$K8S_BIN/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$ETCD_CLIENT_PORT" \
		--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
		--endpoint-reconciler-type none \
		--service-cluster-ip-range 10.96.0.0/24 \
		--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
		--client-ca-file "$PKI/ca.crt" \
		--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types Hostname \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
		--allow-privileged \
		--feature-gates ResourceHealthStatus=true \
		--audit-policy-file "$RUN_DIR/audit-policy.yaml" --audit-log-path "$AUDIT_LOG" \
		--audit-log-maxsize 512 --audit-log-maxbackup 1 \
		--profiling=false
	wait_for kube-apiserver 120 kubectl get --raw /readyz
}

start_controllers() {
	start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
		--kubeconfig "$KCONF/controller-manager.conf" \
		--authentication-kubeconfig "$KCONF/controller-manager.conf" \
		--authorization-kubeconfig "$KCONF/controller-manager.conf" \
		--bind-address 127.0.0.1 --leader-elect=false \
		--use-service-account-credentials \
		--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
		--cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
		--profiling=false
	start kube-scheduler "$K8S_BIN/kube-scheduler" \
		--kubeconfig "$KCONF/scheduler.conf" \
		--authentication-kubeconfig "$KCONF/scheduler.conf" \
		--authorization-kubeconfig "$KCONF/scheduler.conf" \
		--bind-address 127.0.0.1 --leader-elect=false --profiling=false
}

write_containerd_config() {
	mkdir -p "$RUN_DIR/containerd" "$RUN_DIR/cni"
	# A network for pods that do not use the host's: a bridge on a private
	# range, no masquerading. The suite's pods all use hostNetwork; the
	# runtime only needs a network configured to call itself ready.
	cat >"$RUN_DIR/cni/10-e2e.conflist" <<-EOC
	{
	  "cniVersion": "1.0.0",
	  "name": "e2e",
	  "plugins": [
	    {"type": "bridge", "bridge": "e2e0", "isGateway": true, "ipMasq": false,
	     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "dataDir": "/var/lib/cni/networks"}},
	    {"type": "loopback"}
	  ]
	}
	EOC
	cat >"$RUN_DIR/containerd/config.toml" <<-EOC
	# containerd for the e2e cluster; paths are as seen in its mount namespace.
	version = 3
	root = '/var/lib/containerd'
	state = '/run/containerd'

	[grpc]
	  address = '/run/containerd/containerd.sock'

	[plugins.'io.containerd.cri.v1.images']
	  snapshotter = 'overlayfs'
	  [plugins.'io.containerd.cri.v1.images'.pinned_images]
	    sandbox = '$PAUSE_IMAGE'

	[plugins.'io.containerd.cri.v1.runtime']
	  # No CAP_SYS_RESOURCE here: never ask for an OOM score below our own.
	  restrict_oom_score_adj = true
	  enable_cdi = true
	  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
	  [plugins.'io.containerd.cri.v1.runtime'.containerd]
	    default_runtime_name = 'runc'
	    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
	      runtime_type = 'io.containerd.runc.v2'
	      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
	        BinaryName = '$(command -v runc)'
	        SystemdCgroup = false
	  [plugins.'io.containerd.cri.v1.runtime'.cni]
	    bin_dirs = ['/usr/lib/cni', '/opt/cni/bin']
	    conf_dir = '$RUN_DIR/cni'

	[plugins.'io.containerd.grpc.v1.cri']
	  stream_server_address = '127.0.0.1'
	  stream_server_port = '0'

	[plugins.'io.containerd.internal.v1.opt']
	  path = '/var/lib/containerd-opt'

	[plugins.'io.containerd.nri.v1.nri']
	  disable = true
	EOC
}

start_containerd() {
	write_containerd_config
	start containerd env PATH="$CONTAINERD_BIN:$PATH" "$CONTAINERD_BIN/containerd" \
		--config "$RUN_DIR/containerd/config.toml" --log-level info
	wait_for containerd 60 ctr version
}

ctr() { "$CONTAINERD_BIN/ctr" --address "$CONTAINERD_SOCK" "$@"; }
kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$KCONF/admin.conf" "$@"; }

write_kubelet_config() {
	cat >"$RUN_DIR/kubelet.yaml" <<-EOC
	apiVersion: kubelet.config.k8s.io/v1beta1
	kind: KubeletConfiguration
	address: 127.0.0.1
	port: $KUBELET_PORT
	readOnlyPort: 0
	healthzBindAddress: 127.0.0.1
	healthzPort: $KUBELET_HEALTHZ_PORT
	authentication:
	  anonymous: {enabled: false}
	  webhook: {enabled: false}
	  x509: {clientCAFile: $PKI/ca.crt}
	authorization: {mode: AlwaysAllow}
	containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
	cgroupDriver: cgroupfs
	failSwapOn: false
	failCgroupV1: false
	featureGates:
	  ResourceHealthStatus: true
	# The images were imported, not pulled: never collect them.
	imageGCHighThresholdPercent: 100
	imageGCLowThresholdPercent: 99
	evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
	makeIPTablesUtilChains: false
	resolvConf: /etc/resolv.conf
	serializeImagePulls: false
	EOC
}

start_kubelet() {
	start kubelet "$K8S_BIN/kubelet" --config "$RUN_DIR/kubelet.yaml" \
		--kubeconfig "$KCONF/kubelet.conf" --hostname-override "$NODE_NAME" --v 2
	wait_for kubelet 120 curl -fsS "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz"
}

restart_kubelet() {
	alive ns || die "no cluster is running (make e2e-cluster)"
	log "restarting the kubelet"
	stop kubelet
	start_kubelet
}

# ------------------------------------------------------------------- images

import_images() {
	log "building the images"
	"$E2E_CLUSTER_DIR/images.sh" "$IMAGES"
	for tar in "$IMAGES/pause.tar" "$IMAGES/probe.tar" "$IMAGES/plugin/gpu-device-plugin-image.tar" \
		"$IMAGES/nfd-master.tar" "$IMAGES/nfd-worker.tar" \
		"$IMAGES/nvidia-device-plugin.tar" "$IMAGES/gpu-feature-discovery.tar"; do
		ctr -n k8s.io images import "$tar" >&2
	done
	# The previous release (build.sh previous), for the upgrade lane.
	local prev
	if prev=$(previous_dir) && [ -f "$prev/image/gpu-device-plugin-image.tar" ]; then
		ctr -n k8s.io images import "$prev/image/gpu-device-plugin-image.tar" >&2
	else
		log "no previous release built (e2e/cluster/build.sh previous): the upgrade lane will skip"
	fi
}

# previous_dir prints the previous release's build directory (build.sh previous).
previous_dir() {
	local commit; commit=$(previous_commit) || return 1
	echo "$CACHE_DIR/previous/$commit"
}

# previous_env prints the upgrade lane's settings when the previous release is built.
previous_env() {
	local prev
	prev=$(previous_dir 2>/dev/null) && [ -f "$prev/image/gpu-device-plugin-image.tar" ] || return 0
	suite_env \
		E2E_PREVIOUS_RELEASE="$PREVIOUS_RELEASE" \
		E2E_PREVIOUS_IMAGE="$PLUGIN_REPO:$(cat "$prev/version")" \
		E2E_PREVIOUS_CHART="$prev/src/deploy/helm/gpu-device-plugin"
}

# --------------------------------------------------------------------- up/down

write_suite_env() {
	suite_env \
		KUBECONFIG="$KCONF/admin.conf" \
		E2E_NODE="$NODE_NAME" \
		E2E_FIXTURE="$FIXTURE" \
		E2E_DEVICE_PLUGIN_DIR="$NS_VARLIB/kubelet/device-plugins" \
		E2E_CDI_SPEC_DIR=/var/run/cdi \
		E2E_CDI_DIR="$NS_RUN/cdi" \
		E2E_PLUGIN_IMAGE="$PLUGIN_IMAGE" \
		E2E_PROBE_IMAGE="$PROBE_IMAGE" \
		E2E_KUBELET_RESTART="$E2E_CLUSTER_DIR/cluster.sh restart-kubelet" \
		E2E_REPORT_DIR="$REPORT_DIR" \
		E2E_NFD_FEATURES_DIR="$NS_NFD_FEATURES" \
		E2E_NFD_MANIFESTS="$NFD_BIN/manifests" \
		E2E_NFD_MASTER_IMAGE="$NFD_MASTER_IMAGE" \
		E2E_NFD_WORKER_IMAGE="$NFD_WORKER_IMAGE" \
		E2E_NVIDIA_PLUGIN_IMAGE="$NVIDIA_PLUGIN_IMAGE" \
		E2E_NVIDIA_GFD_IMAGE="$NVIDIA_GFD_IMAGE" \
		E2E_SCALE_KUBECONFIG="$KCONF/scale.conf" \
		E2E_AUDIT_LOG="$AUDIT_LOG" \
		E2E_PLUGIN_USER="$PLUGIN_USER" \
		>"$RUN_DIR/suite.env"
	previous_env >>"$RUN_DIR/suite.env"
}

up() {
	[ "$(id -u)" = 0 ] || die "needs root"
	command -v runc >/dev/null || die "runc is not installed (apt-get install -y runc)"
	for b in "$K8S_BIN/kubelet" "$ETCD_BIN/etcd" "$CONTAINERD_BIN/containerd" "$NFD_BIN/nfd-worker" "$NVIDIA_BIN/gpu-feature-discovery"; do
		[ -x "$b" ] || die "$b is missing: run $E2E_CLUSTER_DIR/build.sh"
	done
	[ ! -e "$PIDS/ns.pid" ] || down
	rm -rf "$RUN_DIR" && mkdir -p "$RUN_DIR"
	trap 'log "up failed: logs in $LOGS; cluster.sh down (make e2e-cluster-down) cleans up"' EXIT
	local t0=$SECONDS
	save_sysctls "$RUN_DIR/sysctl.saved"
	if command -v iptables-save >/dev/null; then
		{ iptables-save; ip6tables-save; } 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\).*/\1/p' | sort -u >"$RUN_DIR/iptables.before"
	fi
	make_pki
	make_namespace
	log "fixture: mock NVML on the dgx-h100 profile in $FIXTURE"
	(cd "$REPO_ROOT/e2e" && go run ./cluster/fixture -profile "${E2E_PROFILE:-dgx-h100}" -nics -o "$FIXTURE")
	log "starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler"
	start_etcd
	start_apiserver
	start_controllers
	log "starting containerd $CONTAINERD_VERSION"
	start_containerd
	import_images
	log "starting the kubelet"
	write_kubelet_config
	start_kubelet
	wait_for "node $NODE_NAME" 120 kubectl get node "$NODE_NAME"
	wait_for "node $NODE_NAME Ready" 120 kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
	write_suite_env
	trap - EXIT
	log "cluster up in $((SECONDS - t0))s; KUBECONFIG=$KCONF/admin.conf"
}

# kubepods_cgroups lists the kubelet's top cgroups: /sys/fs/cgroup/kubepods
# on cgroup v2, /sys/fs/cgroup/<controller>/kubepods on v1 (cgroupfs driver).
kubepods_cgroups() {
	ls -d /sys/fs/cgroup/kubepods* /sys/fs/cgroup/*/kubepods* 2>/dev/null || true
}

# cleanup_iptables removes the KUBE-* chains that were not there at up,
# and the rules that jump to them. The kubelet makes none with
# makeIPTablesUtilChains off; this is for kubelets that still do.
cleanup_iptables() {
	[ -f "$RUN_DIR/iptables.before" ] || return 0
	local t table chain rule
	for t in iptables ip6tables; do
		command -v "$t" >/dev/null || continue
		for table in filter nat mangle; do
			for chain in $("$t-save" -t "$table" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\).*/\1/p'); do
				grep -qx -- "$chain" "$RUN_DIR/iptables.before" && continue
				"$t-save" -t "$table" | sed -n "s/^-A \(.* -j $chain\)\$/\1/p" | while read -r rule; do
					eval "$t -t $table -D $rule" || true
				done
				"$t" -t "$table" -F "$chain" || true
				"$t" -t "$table" -X "$chain" || true
			done
		done
	done
}

down() {
	[ "$(id -u)" = 0 ] || die "needs root"
	[ -d "$RUN_DIR" ] || return 0
	log "tearing down"
	# The kubelet first, so it restarts nothing; then every container,
	# through containerd while it still runs.
	stop kubelet
	if alive containerd; then
		local ids
		ids=$(ctr -n k8s.io tasks ls -q 2>/dev/null || true)
		for id in $ids; do ctr -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
		sleep 1
		for id in $ids; do ctr -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true; done
	fi
	stop kube-scheduler kube-controller-manager kube-apiserver containerd
	stop etcd
	# Anything left in the namespace (shims) or in the pods' cgroups.
	local ns; ns=$(readlink "/proc/$(pid_of ns)/ns/mnt" 2>/dev/null || true)
	local pids=() p
	if [ -n "$ns" ]; then
		for p in /proc/[0-9]*; do
			[ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$ns" ] && [ "${p#/proc/}" != "$(pid_of ns)" ] && pids+=("${p#/proc/}")
		done
	fi
	local cgroups; cgroups=$(kubepods_cgroups)
	if [ -n "$cgroups" ]; then
		for p in $(find $cgroups -name cgroup.procs -exec cat {} + 2>/dev/null); do pids+=("$p"); done
	fi
	[ ${#pids[@]} -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null || true
	stop ns
	# Cgroups, deepest first, once their processes are gone.
	local i
	for i in $(seq 20); do
		cgroups=$(kubepods_cgroups)
		[ -n "$cgroups" ] || break
		find $cgroups -depth -type d -exec rmdir {} + 2>/dev/null || true
		sleep 0.5
	done
	restore_sysctls "$RUN_DIR/sysctl.saved"
	cleanup_iptables
	ip link delete e2e0 2>/dev/null || true
	if [ -n "$(kubepods_cgroups)" ]; then
		log "warning: cgroups left behind: $(kubepods_cgroups | tr '\n' ' ')"
	fi
	# The logs outlive the cluster, for CI to keep.
	if [ -d "$LOGS" ]; then
		rm -rf "$REPORT_DIR/logs" && mkdir -p "$REPORT_DIR" && cp -r "$LOGS" "$REPORT_DIR/logs"
	fi
	rm -rf "$RUN_DIR"
	log "down"
}

# Sourced (for debugging a step), define the functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
case "${1:-}" in
up) up ;;
down) down ;;
restart-kubelet) restart_kubelet ;;
env) cat "$RUN_DIR/suite.env" ;;
kubectl) shift; kubectl "$@" ;;
ctr) shift; ctr "$@" ;;
*) die "usage: $0 up|down|restart-kubelet|env|kubectl ARGS|ctr ARGS" ;;
esac
