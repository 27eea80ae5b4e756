#!/usr/bin/env bash
# make gpu-check: builds the bundle (unless GPU_CHECK_BUILD=no, as on a GPU
# node without Go, where a bundle built elsewhere was copied to
# bin/gpu-check), then runs gpu-check on this machine's GPUs when it has the
# NVIDIA driver's /dev/nvidiactl, else on a mock node from cluster/fixture.
# GPU_CHECK_NODE=gpu or mock chooses; GPU_CHECK_OUT is the report's folder.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bundle=${GPU_CHECK_BUNDLE:-bin/gpu-check}
out=${GPU_CHECK_OUT:-bin/gpu-check-report}
if [ "${GPU_CHECK_BUILD:-yes}" != no ]; then
	e2e/cmd/gpucheck/bundle.sh "$bundle"
elif [ ! -x "$bundle/gpu-check" ]; then
	echo "gpu-check: no bundle in $bundle; build it where Go is with 'make gpu-check-bundle' and copy it here" >&2
	exit 1
fi
node=${GPU_CHECK_NODE:-auto}
if [ "$node" = auto ]; then
	if [ -e /dev/nvidiactl ]; then node=gpu; else node=mock; fi
fi
case $node in
gpu)
	exec "$bundle/gpu-check" -health "${GPU_CHECK_HEALTH:-1m}" -out "$out" ${GPU_CHECK_ARGS:-}
	;;
mock)
	fixture=$PWD/bin/gpu-check-node
	(cd e2e && go run ./cluster/fixture -profile "${GPU_CHECK_PROFILE:-pcie-4gpu}" -o "$fixture")
	exec "$bundle/gpu-check" -fixture "$fixture" -health "${GPU_CHECK_HEALTH:-15s}" -out "$out" ${GPU_CHECK_ARGS:-}
	;;
*)
	echo "gpu-check: GPU_CHECK_NODE=$node; want gpu, mock or auto" >&2
	exit 2
	;;
esac
