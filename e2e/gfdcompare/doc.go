// Package gfdcompare checks the plugin's node labels against what NVIDIA's
// GPU Feature Discovery (GFD) writes on the same mock node (issue 28: the
// labels both set match key for key).
//
// The test builds gpu-feature-discovery from its Go module
// (github.com/NVIDIA/k8s-device-plugin at GFDVersion, GFD_VERSION to
// override) once into the cluster cache, $E2E_CLUSTER_CACHE/bin/gfd-<version>
// (e2e/cluster/.cache by default), writes one mock node per case (the mock
// NVML library, sysfs, /dev and /proc of a profile, and a DMI product name),
// runs GFD once (--oneshot) and `gpu-device-plugin list -o json` on it, and
// fails on any difference not in its allow-list. TestNodeFeatureMatchesGFD
// runs GFD with its NodeFeature API output and the plugin's nodeLabels:
// nodefeature writer against a recording fake API server (httptest, and a
// kubeconfig pointing GFD at it) and compares the objects they write.
//
// GFDVersion is v0.19.1: the newest release the Go module proxy serves here
// (it refuses v0.20.x), whose NodeFeature output, gpu.clique and vGPU labels
// are those compared. GFD reads the PCI class and
// config space from /sys itself, so it runs in a private mount namespace with
// the node's sysfs bound over /sys: the test needs root and unshare(1).
//
// It is not part of `make test`; run it with `make gfd-compare`, or
//
//	cd e2e && go test -tags gfdcompare -count=1 -v ./gfdcompare/
//
// The build tag keeps the test out of `go test ./...`.
package gfdcompare
