// Package release holds the checks that a release's parts agree: the
// version in the VERSION file, the one stamped into the binaries, the
// image's and the packages' (all from the Makefile's VERSION), the chart's
// and the manifests', the CHANGELOG's newest section, and the license. It
// builds nothing; its tests read the repository and run make -n.
// docs/development.md, Releases, says how versions are numbered.
package release
