#!/usr/bin/env bash
# make first-look: builds only what the first look runs, then runs it (main.go
# says what it shows). The plugin, by the Makefile's own rule; the mock
# libnvidia-ml.so.1, by e2e/mocknvml's Makefile with go-nvml's nvml.h from
# the main module (the e2e module's go list would load the kubelet's module
# graph); and first-look itself, which compiles only its own two packages
# once the plugin's are built: no kubelet code. Run from the repository root.
set -euo pipefail
cd "$(dirname "$0")/../../.."
began=$(date +%s%N)
GO=${GO:-go}
BIN=${BIN:-bin}

# What is missing, in one line each, before anything runs.
if ! command -v "$GO" >/dev/null; then
	echo "first-look: Go is not installed ($GO not found): install Go 1.26 (https://go.dev/doc/install) and put its bin folder on PATH" >&2
	exit 1
fi
cc=${CC:-$("$GO" env CC)}
if ! command -v "$cc" >/dev/null; then
	echo "first-look: no C compiler ($cc not found): install gcc (apt install gcc, dnf install gcc); cgo and the mock NVML library need it" >&2
	exit 1
fi

now() { date +%s%N; }
took() { # from to, in ns: the time between, as 12.3s
	local ms=$((($2 - $1) / 1000000))
	printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100))
}
step() { # what, then a command: runs it, and says how long it took
	local what=$1 t
	shift
	printf 'first-look: %s ...' "$what"
	t=$(now)
	"$@"
	printf ' %s\n' "$(took "$t" "$(now)")"
}

mkdir -p "$BIN/mocknvml"
bin=$(cd "$BIN" && pwd)
step "building $BIN/gpu-device-plugin and the daemon its serve runs, gpu-device-plugin-dp (go build; the first time, about 420 packages: a minute or so on 2 cores)" \
	"${MAKE:-make}" -s BIN="$bin" GO="$GO" "$bin/gpu-device-plugin" "$bin/gpu-device-plugin-dp"
nvml_h="$("$GO" list -m -f '{{.Dir}}' github.com/NVIDIA/go-nvml)/pkg/nvml"
step "building the mock libnvidia-ml.so.1 ($cc)" \
	"${MAKE:-make}" -s -C e2e/mocknvml CC="$cc" OUT="$bin/mocknvml" NVML_INCLUDE="$nvml_h" "$bin/mocknvml/libnvidia-ml.so.1"
step "building $BIN/first-look (e2e/cmd/firstlook)" \
	sh -c 'cd e2e && exec "$0" build -trimpath -o "$1" ./cmd/firstlook' "$GO" "$bin/first-look"
built=$(now)

"$bin/first-look" -plugin "$bin/gpu-device-plugin" -mock "$bin/mocknvml/libnvidia-ml.so.1" \
	-profile e2e/profiles/dgx-h100.profile
echo
echo "first-look: done in $(took "$began" "$(now)"), $(took "$began" "$built") of it building." \
	"Next: make demo (the kubelet's own code driving the plugin), docs/cli.md (every command)."
