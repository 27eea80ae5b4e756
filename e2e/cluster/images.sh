#!/usr/bin/env bash
# Builds the three image tarballs a test node needs, for cluster.sh and
# kind.sh alike:
#   OUT/plugin/gpu-device-plugin-image.tar  the plugin (make image), localhost/gpu-device-plugin:e2e;
#                                           with gpu-device-plugin-dp and gpu-device-plugin-dra, which
#                                           serve execs in device-plugin and DRA mode
#                                           and gpu-device-plugin-controller, the ComputeDomain controller
#   OUT/probe.tar                           the test container, $PROBE_IMAGE
#   OUT/pause.tar                           the pod sandbox, $PAUSE_IMAGE
#   OUT/nfd-master.tar, OUT/nfd-worker.tar  Node Feature Discovery (build.sh nfd, built here if
#                                           missing), $NFD_MASTER_IMAGE and $NFD_WORKER_IMAGE:
#                                           one static binary each, as kind's control-plane images
#   OUT/nvidia-device-plugin.tar,           NVIDIA's device plugin and GFD (build.sh nvidia, built here
#   OUT/gpu-feature-discovery.tar           if missing), $NVIDIA_PLUGIN_IMAGE and $NVIDIA_GFD_IMAGE: the
#                                           binary (cgo) with this machine's loader and libraries
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out=${1:?usage: images.sh OUTDIR}
mkdir -p "$out"
"$E2E_CLUSTER_DIR/build.sh" nfd
"$E2E_CLUSTER_DIR/build.sh" nvidia
(cd "$REPO_ROOT/e2e" && go run ./cluster/images -o "$out" -pause "$PAUSE_IMAGE" -probe "$PROBE_IMAGE" \
	-bin "$NFD_MASTER_IMAGE=$NFD_BIN/nfd-master" -bin "$NFD_WORKER_IMAGE=$NFD_BIN/nfd-worker" \
	-bin "$NVIDIA_PLUGIN_IMAGE=$NVIDIA_BIN/nvidia-device-plugin" -bin "$NVIDIA_GFD_IMAGE=$NVIDIA_BIN/gpu-feature-discovery")
# PCI_IDS=none: the fake sysfs has no NICs to name, and a CI machine may
# have no pci.ids.
make -C "$REPO_ROOT" --no-print-directory image VERSION="$PLUGIN_TAG" IMAGE_REPO="$PLUGIN_REPO" \
	PCI_IDS=none BIN="$out/plugin" >&2
