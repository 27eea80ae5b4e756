// Package release assembles, checks and publishes a release's folder
// (make release, make push): the image for every platform as one OCI
// image index, the Helm chart, the node packages, the static CDI hook per
// platform, a CycloneDX SBOM of the binaries and SHA256SUMS. Verify fails
// unless every part carries the one version (the VERSION file's, as make
// passes it) and every file matches its sum.
//
// Its tests also pin the repository's own parts against the VERSION file:
// the chart, the manifests, the CHANGELOG, make's ldflags and the version
// make gives imagebuild, pkgbuild and the release. docs/development.md,
// Releases, says how versions are numbered and how a release is cut.
package release
