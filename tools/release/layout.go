package release

import (
	"fmt"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/tools/version"
)

// The release's names that do not depend on its version.
const (
	// Name is the product's, the chart's and the packages' name.
	Name = "gpu-device-plugin"
	// SumsFile lists every other file of the folder with its SHA-256, in
	// sha256sum's format: sha256sum -c SHA256SUMS checks them.
	SumsFile = "SHA256SUMS"
)

// Binaries are the executables every platform ships, as cmd/ names them:
// the plugin, the executables its serve command runs from beside it
// (gpu-device-plugin-dp, the device-plugin mode's, which it runs by
// default; gpu-device-plugin-dra, DRA mode's), the ComputeDomain
// controller (gpu-device-plugin-controller, which gpu-device-plugin-dra
// also execs from beside it) and the CDI hook.
func Binaries() []string {
	return []string{"gpu-device-plugin", "gpu-device-plugin-dp", "gpu-device-plugin-dra", "gpu-device-plugin-controller", "gpu-device-plugin-cdi-hook"}
}

// HookBinary is the one shipped on its own too: the container runtime
// runs it on the host.
const HookBinary = "gpu-device-plugin-cdi-hook"

// Platform is an OS and architecture, as in linux/arm64.
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// ParsePlatforms reads a comma-separated list such as
// "linux/amd64,linux/arm64".
func ParsePlatforms(s string) ([]Platform, error) {
	var out []Platform
	for _, f := range strings.Split(s, ",") {
		goos, arch, ok := strings.Cut(strings.TrimSpace(f), "/")
		if !ok || goos == "" || arch == "" || strings.Contains(arch, "/") {
			return nil, fmt.Errorf("platform %q: want os/arch, such as linux/arm64", f)
		}
		out = append(out, Platform{goos, arch})
	}
	return out, nil
}

// Layout names the files of one version's release folder.
type Layout struct{ Version string }

// ImageArchive is the OCI image layout, as a tarball, holding the image
// index of every platform's image.
func (l Layout) ImageArchive() string { return Name + "-image-" + version.Tag(l.Version) + ".oci.tar" }

// Chart is the Helm chart's package, named as helm package names it.
func (l Layout) Chart() string {
	v, _ := version.Chart(l.Version)
	return Name + "-" + v + ".tgz"
}

// Hook is the static CDI hook for one platform.
func (l Layout) Hook(p Platform) string {
	return HookBinary + "-" + l.Version + "-" + p.OS + "-" + p.Arch
}

// SBOM is the CycloneDX JSON document covering every binary.
func (l Layout) SBOM() string { return Name + "-" + l.Version + ".cdx.json" }
