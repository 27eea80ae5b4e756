#!/usr/bin/env bash
# Runs the end-to-end suite (e2e/cluster/suite) with the settings a
# cluster script wrote: suite.sh e2e/cluster/.run/suite.env (local) or
# suite.sh e2e/kind/.run/suite.env (kind). Extra arguments go to go test.
set -euo pipefail
envfile=$(realpath "${1:?usage: suite.sh SUITE.ENV [go test flags]}"); shift
set -a
# shellcheck disable=SC1090
. "$envfile"
set +a
cd "$(dirname "$0")/.."
# Helm's client, in a binary of its own (e2e/cmd/helminstall says why), for
# the lanes that install the chart with Helm.
if [ -z "${E2E_SUITE_PKG:-}" ]; then
	E2E_HELM=$(dirname "$envfile")/helminstall
	go build -o "$E2E_HELM" ./cmd/helminstall
	export E2E_HELM
fi
exec go test -count=1 -v -timeout 20m "$@" "${E2E_SUITE_PKG:-./cluster/suite/}"
