// Package deploy tests what ships: the static DaemonSet manifest and the
// Helm chart under deploy/ (decoded strictly into the k8s.io/api types and
// checked by the API server's own validation), the container image that
// `make image` assembles, and the .deb and .rpm that `make packages`
// builds, installed for real with dpkg when the test runs as root.
package deploy
