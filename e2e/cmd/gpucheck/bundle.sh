#!/usr/bin/env bash
# Builds what gpu-check runs from into one folder that can be copied to a
# GPU node with nothing installed: gpu-check itself, the plugin with the
# daemon its serve execs (gpu-device-plugin-dp) and its CDI hook, the
# container probe, the C library the probe's image is made of (with a
# static ldconfig), runc with the libraries it needs, for a node
# without one, and NVIDIA's device plugin for the serve step's side-by-side
# comparison (built as the migration lane builds it, by
# e2e/cluster/build.sh nvidia, at GPU_CHECK_NVIDIA_VERSION). Run from the
# repository root (make gpu-check-bundle).
set -euo pipefail
out=${1:?usage: bundle.sh DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/image" "$out/lib" "$out/gpu-device-plugin-dra" "$out/nvidia-device-plugin"
mkdir -p "$out/image" "$out/lib"

make -s BIN="$out" "$out/gpu-device-plugin" "$out/gpu-device-plugin-dp" "$out/gpu-device-plugin-cdi-hook"
(cd e2e && go build -trimpath -ldflags '-s -w' -o "$out/gpu-check" ./cmd/gpucheck)
${CC:-gcc} -O2 -Wall -Wextra -o "$out/cudaprobe" e2e/cmd/gpucheck/cudaprobe/cudaprobe.c -ldl

# The image's C library: what the probe links, and what libcuda links
# (libm, libdl, libpthread, librt, libgcc_s), by soname.
copy_lib() { # soname path
	cp -L "$2" "$out/image/$1"
}
ldd "$out/cudaprobe" | awk '/=>/ {print $1, $3} /ld-linux/ && !/=>/ {print $1, $1}' | while read -r soname path; do
	copy_lib "$(basename "$soname")" "$path"
done
for soname in libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libgcc_s.so.1; do
	# awk reads to the end: stopping at the first match would kill ldconfig
	# with SIGPIPE, which pipefail turns into this script's exit (141).
	path=$(ldconfig -p | awk -v s="$soname" '$1 == s && /x86-64/ && !p {p = $NF} END {print p}')
	[ -n "$path" ] && copy_lib "$soname" "$path"
done
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
ldd_out=$(ldd "$ldconfig" 2>&1 || true)
if ! grep -Eq 'statically linked|not a dynamic executable' <<<"$ldd_out"; then
	echo "bundle: $ldconfig is not static; the image needs a static ldconfig" >&2
	exit 1
fi
cp -L "$ldconfig" "$out/image/ldconfig"

# runc for nodes without one, with its libraries but not the C library.
if runc=$(command -v runc); then
	cp -L "$runc" "$out/runc"
	ldd "$runc" | awk '/=>/ && $1 !~ /^(libc|ld-linux)/ {print $3}' | while read -r path; do
		cp -L "$path" "$out/lib/"
	done
fi
# NVIDIA's plugin is for comparison only: without it (no module proxy
# here) gpu-check says so and runs its own checks.
nvidia_version=${GPU_CHECK_NVIDIA_VERSION:-v0.19.1}
if NVIDIA_VERSION=$nvidia_version NVIDIA_TOOLKIT_VERSION=${GPU_CHECK_NVIDIA_TOOLKIT_VERSION:-v1.19.0} \
	LOG_TAG=bundle e2e/cluster/build.sh nvidia; then
	cache=${E2E_CLUSTER_CACHE:-e2e/cluster/.cache}
	cp -L "$cache/bin/nvidia-$nvidia_version/nvidia-device-plugin" "$out/nvidia-device-plugin"
else
	echo "bundle: NVIDIA's device plugin $nvidia_version not built (above); gpu-check runs without the side-by-side comparison" >&2
fi
du -sh "$out" | awk '{print "bundle: " $2 " (" $1 ")"}'
