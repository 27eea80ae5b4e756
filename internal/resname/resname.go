// Package resname is the vocabulary of the extended resource names the
// plugin serves devices under: whole GPUs, MIG profiles and shared
// replicas. It holds names only, and imports nothing of ours, so that the
// settings, the model and the front-ends all spell a name one way.
package resname

import "strings"

// GPU is the extended resource whole GPUs are served as, the one place
// the name is written.
const GPU = "nvidia.com/gpu"

// MIGPrefix starts every resource MIG devices are served as under the
// mixed strategy.
const MIGPrefix = "nvidia.com/mig-"

// MIG is the resource a MIG profile is served as under the mixed
// strategy. Extended resource names allow no "+", so "1g.10gb+me"
// becomes nvidia.com/mig-1g.10gb.me, as NVIDIA's plugin names it.
func MIG(profile string) string {
	return MIGPrefix + strings.ReplaceAll(profile, "+", ".")
}

// SharedSuffix is appended to a resource whose replicas are served under
// a name of their own by default (renameByDefault).
const SharedSuffix = ".shared"
