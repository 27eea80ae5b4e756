#!/usr/bin/env bash
# Builds the cluster's binaries from the Go module proxy, once per version:
#   kubernetes: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl
#   etcd:       etcd (server)
#   containerd: containerd, containerd-shim-runc-v2, ctr (CDI on by default in 2.x)
#   kubeadm:    kubeadm (kind's node image; not part of "all")
#   nfd:        nfd-master, nfd-worker (Node Feature Discovery, for the labels lane)
#   nvidia:     nvidia-device-plugin, gpu-feature-discovery (NVIDIA's, for the migration lane)
#   previous:   the plugin's previous release (PREVIOUS_RELEASE) from git, its image built by
#               its own make image, into .cache/previous/<commit>/ (the upgrade lane)
# Each goes to .cache/bin/<component>-<version>/, written only when the whole
# build succeeded, so an existing directory means "done" and is never rebuilt.
# Kubernetes is built from a scratch module that requires k8s.io/kubernetes
# and replaces every staging module with its published v0.x (the repository
# itself replaces them with ./staging paths, which a dependency cannot use).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local

# scratch_module DIR MODULE: an empty module to build dependencies' commands in.
scratch_module() {
	rm -rf "$1" && mkdir -p "$1"
	printf 'module %s\n\ngo 1.24.0\n' "$2" >"$1/go.mod"
}

# finish TMP DEST: publish a completed build directory atomically.
finish() {
	rm -rf "$2" && mv "$1" "$2"
}

# kubernetes_module: the scratch module (src/kubernetes-VERSION) that
# requires k8s.io/kubernetes with every staging module replaced; made once.
kubernetes_module() {
	K8S_SRC=$CACHE_DIR/src/kubernetes-$K8S_VERSION
	[ -f "$K8S_SRC/.ready" ] && return
	local staging=v0.${K8S_VERSION#v1.}
	scratch_module "$K8S_SRC" e2e-cluster/kubernetes
	# The go tool fetches it, so the user's GOPROXY, GOFLAGS and GONOSUMDB apply.
	local info gomod mod
	info=$(cd "$K8S_SRC" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION") ||
		die "go mod download k8s.io/kubernetes@$K8S_VERSION: $info"
	gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' <<<"$info")
	[ -n "$gomod" ] && [ -r "$gomod" ] || die "go mod download named no go.mod for k8s.io/kubernetes@$K8S_VERSION: $info"
	mod=$(<"$gomod")
	{
		echo 'godebug default=go1.24'
		echo "require k8s.io/kubernetes $K8S_VERSION"
		echo 'replace ('
		# Every "k8s.io/x => ./staging/src/k8s.io/x" becomes "k8s.io/x => k8s.io/x v0.N.P".
		sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging"'#p' <<<"$mod"
		echo ')'
	} >>"$K8S_SRC/go.mod"
	local n; n=$(grep -c " => k8s.io/" "$K8S_SRC/go.mod")
	[ "$n" -ge 30 ] || die "only $n staging modules found in k8s.io/kubernetes@$K8S_VERSION's go.mod"
	touch "$K8S_SRC/.ready"
}

# build_kubernetes_commands DEST CMD...: k8s.io/kubernetes/cmd/CMD for each,
# into DEST, stamped with the version as a release build would be.
build_kubernetes_commands() {
	local dest=$1; shift
	kubernetes_module
	local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
	local out=$dest.tmp pkgs=() c
	for c in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
	local pkg=k8s.io/component-base/version cpkg=k8s.io/client-go/pkg/version ldflags="-s -w"
	for p in $pkg $cpkg; do
		ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
		ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
	done
	rm -rf "$out" && mkdir -p "$out"
	(cd "$K8S_SRC" && go build -trimpath -ldflags "$ldflags" -o "$out/" "${pkgs[@]}")
	finish "$out" "$dest"
}

build_kubernetes() {
	[ -x "$K8S_BIN/kubelet" ] && return
	log "building kubernetes $K8S_VERSION (cold: ~15 min on 2 cores)"
	build_kubernetes_commands "$K8S_BIN" kubelet kube-apiserver kube-controller-manager kube-scheduler kubectl
}

# kubeadm, for kind's node image only (the local cluster needs none).
build_kubeadm() {
	[ -x "$KUBEADM_BIN/kubeadm" ] && return
	log "building kubeadm $K8S_VERSION"
	build_kubernetes_commands "$KUBEADM_BIN" kubeadm
}

build_etcd() {
	[ -x "$ETCD_BIN/etcd" ] && return
	local src=$CACHE_DIR/src/etcd-$ETCD_VERSION out=$CACHE_DIR/bin/.etcd-$ETCD_VERSION.tmp
	log "building etcd $ETCD_VERSION"
	scratch_module "$src" e2e-cluster/etcd
	echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION" >>"$src/go.mod"
	rm -rf "$out" && mkdir -p "$out"
	# The server module's root package is etcd's main.
	(cd "$src" && go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3)
	finish "$out" "$ETCD_BIN"
}

build_containerd() {
	[ -x "$CONTAINERD_BIN/containerd" ] && return
	local src=$CACHE_DIR/src/containerd-$CONTAINERD_VERSION out=$CACHE_DIR/bin/.containerd-$CONTAINERD_VERSION.tmp
	log "building containerd $CONTAINERD_VERSION"
	scratch_module "$src" e2e-cluster/containerd
	echo "require github.com/containerd/containerd/v2 $CONTAINERD_VERSION" >>"$src/go.mod"
	local m=github.com/containerd/containerd/v2
	rm -rf "$out" && mkdir -p "$out"
	# No cgo: the btrfs and devmapper snapshotters (cgo, extra headers) drop out.
	(cd "$src" && go build -trimpath -tags "no_btrfs no_devmapper no_zfs no_aufs" \
		-ldflags "-s -w -X $m/version.Version=$CONTAINERD_VERSION" -o "$out/" \
		$m/cmd/containerd $m/cmd/containerd-shim-runc-v2 $m/cmd/ctr)
	finish "$out" "$CONTAINERD_BIN"
}

# Node Feature Discovery's master and worker, for the node-labels lane, and
# beside them (manifests/) its CRDs and RBAC from the module's own
# deployment/base, which the suite applies. Its go.mod replaces ./api/nfd and pins every k8s.io module with replace
# directives, which a dependency's build ignores: the scratch module requires
# the published api/nfd module and repeats NFD's k8s.io replaces.
build_nfd() {
	[ -f "$NFD_BIN/manifests/nfd-api-crds.yaml" ] && return
	local src=$CACHE_DIR/src/nfd-$NFD_VERSION out=$CACHE_DIR/bin/.nfd-$NFD_VERSION.tmp
	local m=sigs.k8s.io/node-feature-discovery
	log "building node-feature-discovery $NFD_VERSION (cold: ~2 min on 2 cores)"
	scratch_module "$src" e2e-cluster/nfd
	local info gomod
	info=$(cd "$src" && go mod download -json "$m@$NFD_VERSION") || die "go mod download $m@$NFD_VERSION: $info"
	gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' <<<"$info")
	[ -n "$gomod" ] && [ -r "$gomod" ] || die "go mod download named no go.mod for $m@$NFD_VERSION: $info"
	{
		# NFD's own go directive (newer than the scratch module's).
		sed -n 's/^go \([0-9.]*\)$/go \1/p' "$gomod"
		echo "require $m $NFD_VERSION"
		echo "require $m/api/nfd $NFD_VERSION"
		echo 'replace ('
		sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => \(k8s.io/[a-z0-9-]* v[^ ]*\)$#\t\1 => \2#p' "$gomod"
		echo ')'
	} >>"$src/go.mod"
	# The last go line wins for the go tool; keep only NFD's.
	sed -i '0,/^go /{/^go /d}' "$src/go.mod"
	local n; n=$(grep -c " => k8s.io/" "$src/go.mod")
	[ "$n" -ge 20 ] || die "only $n k8s.io replaces found in $m@$NFD_VERSION's go.mod"
	local dir
	dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$info")
	[ -f "$dir/deployment/base/nfd-crds/nfd-api-crds.yaml" ] || die "no deployment/base in $m@$NFD_VERSION ($dir)"
	rm -rf "$out" && mkdir -p "$out/manifests"
	cp "$dir/deployment/base/nfd-crds/nfd-api-crds.yaml" "$out/manifests/"
	local f
	for f in "$dir"/deployment/base/rbac/*.yaml; do
		[ "$(basename "$f")" = kustomization.yaml ] || cp "$f" "$out/manifests/rbac-$(basename "$f")"
	done
	chmod -R u+w "$out/manifests"
	(cd "$src" && go build -trimpath -ldflags "-s -w -X $m/pkg/version.version=$NFD_VERSION" -o "$out/" \
		$m/cmd/nfd-master $m/cmd/nfd-worker)
	finish "$out" "$NFD_BIN"
}

# NVIDIA's device plugin and GPU Feature Discovery, for the migration lane:
# the commands of github.com/NVIDIA/k8s-device-plugin in a scratch module
# that requires it. go-nvml reaches NVML through cgo (dlopen), so these two
# are built with cgo and linked against the machine's glibc; images.sh puts
# that glibc's loader and libraries into their images, as make image does
# for ours.
build_nvidia() {
	[ -x "$NVIDIA_BIN/gpu-feature-discovery" ] && return
	local src=$CACHE_DIR/src/nvidia-$NVIDIA_VERSION out=$CACHE_DIR/bin/.nvidia-$NVIDIA_VERSION.tmp
	local m=github.com/NVIDIA/k8s-device-plugin
	log "building NVIDIA's device plugin and GFD $NVIDIA_VERSION (cold: ~2 min on 2 cores)"
	scratch_module "$src" e2e-cluster/nvidia
	# v0.19.1 requires an untagged nvidia-container-toolkit commit that the
	# checksum database does not list; NVIDIA_TOOLKIT_VERSION (gpu-check's
	# bundle sets v1.19.0) puts a release in its place.
	if [ -n "${NVIDIA_TOOLKIT_VERSION:-}" ]; then
		(cd "$src" && go mod edit -replace "github.com/NVIDIA/nvidia-container-toolkit=github.com/NVIDIA/nvidia-container-toolkit@$NVIDIA_TOOLKIT_VERSION")
	fi
	(cd "$src" && go get "$m/cmd/nvidia-device-plugin@$NVIDIA_VERSION" "$m/cmd/gpu-feature-discovery@$NVIDIA_VERSION")
	rm -rf "$out" && mkdir -p "$out"
	(cd "$src" && CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X $m/internal/info.version=$NVIDIA_VERSION" -o "$out/" \
		$m/cmd/nvidia-device-plugin $m/cmd/gpu-feature-discovery)
	finish "$out" "$NVIDIA_BIN"
}

# The previous release (PREVIOUS_RELEASE, lib.sh), for the upgrade lane:
# its tree from git (git archive: no worktree registered, nothing of this
# checkout's state), its image from that tree's own make image, so it is
# installed exactly as that release would be. Keyed by the full commit, so a
# warm machine reuses it. VERSION, COMMIT and SOURCE_DATE_EPOCH are given:
# the tree has no .git, and git there would describe the checkout above.
build_previous() {
	local commit; commit=$(previous_commit)
	local dest=$CACHE_DIR/previous/$commit
	[ -f "$dest/image/gpu-device-plugin-image.tar" ] && return
	local out=$CACHE_DIR/previous/.$commit.tmp version epoch
	version=$(git -C "$REPO_ROOT" describe --tags --always "$commit")
	epoch=$(git -C "$REPO_ROOT" log -1 --format=%ct "$commit")
	log "building the previous release $PREVIOUS_RELEASE ($version, ${commit:0:12}) with its own make image"
	rm -rf "$out" && mkdir -p "$out/src"
	git -C "$REPO_ROOT" archive "$commit" | tar -x -C "$out/src"
	# Its own Makefile and go.mod, as a checkout of it would build: cgo on
	# (NVML), no -mod=mod.
	(cd "$out/src" && env -u GOFLAGS CGO_ENABLED=1 make --no-print-directory image \
		VERSION="$version" COMMIT="${commit:0:7}" SOURCE_DATE_EPOCH="$epoch" \
		IMAGE_REPO="$PLUGIN_REPO" PCI_IDS=none BIN="$out/image") >&2
	echo "$version" >"$out/version"
	finish "$out" "$dest"
}

mkdir -p "$CACHE_DIR/bin"
case "${1:-all}" in
kubernetes) build_kubernetes ;;
kubeadm) build_kubeadm ;;
etcd) build_etcd ;;
containerd) build_containerd ;;
nfd) build_nfd ;;
nvidia) build_nvidia ;;
previous) build_previous ;;
all) build_etcd; build_containerd; build_kubernetes; build_nfd; build_nvidia; build_previous ;;
*) die "usage: $0 [all|kubernetes|kubeadm|etcd|containerd|nfd|nvidia|previous]" ;;
esac
