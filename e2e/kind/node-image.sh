#!/usr/bin/env bash
# Builds a kind node image on this machine, for machines that cannot pull
# kindest/node: a Debian root filesystem (mmdebstrap, from the distribution's
# packages through apt's own configuration) with systemd and Debian's runc
# and CNI plugins, plus what e2e/cluster/build.sh builds: containerd, the
# kubelet, kubectl, kubeadm, and the control plane's images (kube-apiserver,
# -controller-manager, -scheduler, etcd at the version kubeadm deploys, the
# pause image), preloaded on boot. node/rootfs/ holds the rest: the
# entrypoint, the systemd units, containerd's configuration and the
# manifests kind applies.
#
#   node-image.sh OUT.tar   write the image's root filesystem as a tarball
#                           (`docker import` it with the changes in
#                           NODE_IMAGE_CHANGES); cached by its inputs
#
# Cached under $CACHE_DIR/kind/: the Debian root filesystem by its package
# list and suite, the whole image by a hash of every input.
LOG_TAG=e2e-kind
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"

KIND_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:?usage: node-image.sh OUT.tar}

# The etcd kubeadm $K8S_VERSION deploys (its constants' SupportedEtcdVersion).
KIND_ETCD_VERSION=${KIND_ETCD_VERSION:-v3.7.0}
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}
# What a kind node runs besides our binaries: systemd as PID 1 (and dbus for
# the kubelet's systemd cgroup driver), runc, CNI plugins, and the tools the
# kubelet and kubeadm call (mount, iptables, conntrack, ...).
PACKAGES=systemd,systemd-sysv,dbus,runc,containernetworking-plugins,iptables,nftables,iproute2,mount,util-linux,procps,kmod,ca-certificates,conntrack,ethtool,socat,ebtables,hostname,libseccomp2

if ! command -v mmdebstrap >/dev/null; then
	log "installing mmdebstrap (Debian's)"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >&2 ||
		die "installing mmdebstrap failed; install it, or use KIND_NODE_IMAGE=upstream"
fi
mkdir -p "$CACHE_DIR/kind"
# What a killed build left: a root filesystem's worth each.
rm -rf "$CACHE_DIR/kind/.build."* "$CACHE_DIR/kind/"*.tmp

# rootfs: the Debian part, cached by suite and packages. apt's sources and
# options are the host's, so its mirror and proxy settings apply.
rootfs_tar=$CACHE_DIR/kind/rootfs-$DEBIAN_SUITE-$(printf '%s' "$PACKAGES" | sha256sum | cut -c1-12).tar
if [ ! -s "$rootfs_tar" ]; then
	log "debian $DEBIAN_SUITE root filesystem (mmdebstrap, ~90 s)"
	sources=()
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[ -s "$f" ] && sources+=("$f")
	done
	aptopts=()
	for f in /etc/apt/apt.conf.d/*; do
		[ -f "$f" ] && aptopts+=("--aptopt=$f")
	done
	mmdebstrap --variant=minbase --format=tar --include="$PACKAGES" "${aptopts[@]}" \
		--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		"$DEBIAN_SUITE" "$rootfs_tar.tmp" "${sources[@]}" >&2 || die "mmdebstrap $DEBIAN_SUITE failed"
	mv "$rootfs_tar.tmp" "$rootfs_tar"
fi

"$E2E_CLUSTER_DIR/build.sh" kubernetes
"$E2E_CLUSTER_DIR/build.sh" containerd
"$E2E_CLUSTER_DIR/build.sh" kubeadm
ETCD_VERSION=$KIND_ETCD_VERSION "$E2E_CLUSTER_DIR/build.sh" etcd
etcd_bin=$CACHE_DIR/bin/etcd-$KIND_ETCD_VERSION/etcd

# The whole image is cached by a hash of everything that goes into it.
key=$({
	echo "$K8S_VERSION $CONTAINERD_VERSION $KIND_ETCD_VERSION $PAUSE_IMAGE"
	basename "$rootfs_tar"
	cat "${BASH_SOURCE[0]}"
	(cd "$KIND_DIR/node/rootfs" && find . -type f | LC_ALL=C sort | xargs sha256sum)
	(cd "$REPO_ROOT/e2e/cluster/images" && find . -type f ! -name '*_test.go' | LC_ALL=C sort | xargs sha256sum)
} | sha256sum | cut -c1-16)
cached=$CACHE_DIR/kind/node-$K8S_VERSION-$key.tar
if [ -s "$cached" ]; then
	ln -f "$cached" "$out" 2>/dev/null || cp "$cached" "$out"
	exit 0
fi

log "kind node image $K8S_VERSION ($key)"
work=$(mktemp -d "$CACHE_DIR/kind/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"
tar -C "$root" -xf "$rootfs_tar"
cp -a "$KIND_DIR/node/rootfs/." "$root/"
install -m 0755 "$K8S_BIN/kubelet" "$K8S_BIN/kubectl" "$KUBEADM_BIN/kubeadm" "$root/usr/bin/"
install -m 0755 "$CONTAINERD_BIN/containerd" "$CONTAINERD_BIN/containerd-shim-runc-v2" "$CONTAINERD_BIN/ctr" "$root/usr/local/bin/"
# containerd and kubeadm look for CNI plugins where Debian does not put them.
mkdir -p "$root/opt/cni"
ln -s /usr/lib/cni "$root/opt/cni/bin"
echo "$K8S_VERSION" >"$root/kind/version"

# The control plane as kubeadm names it, and the sandbox containerd uses.
mkdir -p "$root/kind/images"
(cd "$REPO_ROOT/e2e" && go run ./cluster/images -o "$root/kind/images" -pause "$PAUSE_IMAGE" -probe "" \
	-bin "registry.k8s.io/kube-apiserver:$K8S_VERSION=$K8S_BIN/kube-apiserver" \
	-bin "registry.k8s.io/kube-controller-manager:$K8S_VERSION=$K8S_BIN/kube-controller-manager" \
	-bin "registry.k8s.io/kube-scheduler:$K8S_VERSION=$K8S_BIN/kube-scheduler" \
	-bin "registry.k8s.io/etcd:${KIND_ETCD_VERSION#v}-0=$etcd_bin") >&2

# systemd: boot to multi-user with containerd, the image preload and the
# kubelet (which waits for kubeadm's configuration); nothing a container
# cannot run.
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
for unit in containerd.service kind-preload.service kubelet.service; do
	ln -sf "/etc/systemd/system/$unit" "$root/etc/systemd/system/multi-user.target.wants/$unit"
done
ln -sf /lib/systemd/system/multi-user.target "$root/etc/systemd/system/default.target"
for unit in getty.target systemd-firstboot.service systemd-udevd.service systemd-modules-load.service \
	systemd-remount-fs.service sys-kernel-debug.mount sys-kernel-tracing.mount; do
	ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
: >"$root/etc/machine-id"

tar -C "$root" --numeric-owner -cf "$cached.tmp" .
rm -f "$CACHE_DIR/kind/node-$K8S_VERSION-"*.tar # earlier inputs' images
mv "$cached.tmp" "$cached"
ln -f "$cached" "$out" 2>/dev/null || cp "$cached" "$out"
