package labels

import (
	"cmp"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// Prefix is the label domain GFD uses, which the labels keep.
const Prefix = "nvidia.com/"

// Values of the gpu.sharing-strategy label.
const (
	SharingNone        = "none"
	SharingTimeSlicing = "time-slicing"
	SharingMPS         = "mps"
)

// PCI class codes that tell the GPU's mode (gpu.mode).
const (
	classVGA = 0x030000 // a display controller: "graphics"
	class3D  = 0x030200 // a 3D controller: "compute"
)

// Facts are what the labels are made of.
type Facts struct {
	Inventory   *nvml.Inventory
	MIGStrategy string
	TimeSlicing sharing.TimeSlicing
	MPS         sharing.MPS
	// Machine is the DMI product name; empty when unknown.
	Machine string
	// PCIClass is each GPU's PCI class code by bus ID; a GPU missing
	// here makes gpu.mode "unknown".
	PCIClass map[string]uint32
	// VGPU is what the NVIDIA PCI functions' config space says of vGPU;
	// nil when it could not be read whole, which sets no vgpu.* label.
	VGPU *sysfs.VGPU
}

// KeyPattern matches every key Compute can return and no other label,
// so that whoever writes the labels onto the Node can tell its own keys
// from the rest of nvidia.com/ (the GPU operator's gpu.present,
// gpu.deploy.*, mig.config, device-plugin.config, GFD's gfd.timestamp).
// It is RE2, which CEL's matches() speaks too: the chart's admission policy
// for nodeLabels: node holds this very text.
const KeyPattern = `^nvidia\.com/(` +
	`(gpu|mig-[0-9a-z][0-9a-z.]*)\.(product|count|replicas|sharing-strategy|memory|multiprocessors|slices\.(gi|ci)|engines\.(copy|decoder|encoder|jpeg|ofa))` +
	`|gpu\.(family|compute\.(major|minor)|mode|machine|clique)` +
	`|cuda\.(driver\.(major|minor|rev)|driver-version\.(major|minor|revision|full)|runtime\.(major|minor)|runtime-version\.(major|minor|full))` +
	`|mig\.(capable|strategy)|mps\.capable` +
	`|vgpu\.(present|host-driver-version|host-driver-branch)` +
	`)$`

// MaxKeys bounds how many keys Compute returns, and the chart's admission
// policy for nodeLabels: node holds it too. The node-wide keys and the
// majority model's gpu.* are 29 (37 with the single MIG strategy's MIG
// attributes); the mixed strategy adds perProfileKeys for each MIG profile
// in use. NVML knows 18 GPU-instance profiles (GPU_INSTANCE_PROFILE_COUNT),
// each named once per GPU model, so a node of two GPU models in MIG mode
// has at most 36 profile names: 29 + 13*36.
const MaxKeys = nodeWideKeys + perProfileKeys*maxMIGProfiles

const (
	nodeWideKeys   = 29
	perProfileKeys = 13
	maxMIGProfiles = 2 * 18
)

var ownKey = regexp.MustCompile(KeyPattern)

// IsKey says whether key is one Compute may return (KeyPattern).
func IsKey(key string) bool { return ownKey.MatchString(key) }

// Labels are node labels, key to value.
type Labels map[string]string

// Keys returns the keys in order.
func (l Labels) Keys() []string { return slices.Sorted(maps.Keys(l)) }

// Compute returns the labels for the node's GPUs; none without GPUs.
//
// A node with several GPU models is labelled for one of them: the model
// with the most GPUs, a tie going to the model of the lowest-indexed GPU.
// gpu.product, gpu.count, gpu.memory and the architecture labels all
// describe that model (GFD picks one at random on every run, so its labels
// flap on such nodes).
func Compute(f Facts) Labels {
	if f.Inventory == nil || len(f.Inventory.GPUs) == 0 {
		return nil
	}
	gpus := f.Inventory.GPUs
	l := Labels{}
	l.set("gpu.machine", orUnknown(truncate(sanitise(f.Machine))))
	l.set("gpu.mode", mode(gpus, f.PCIClass))
	l.addVersions(f.Inventory)
	if c := clique(gpus); c != "" {
		l.set("gpu.clique", c)
	}
	if v := f.VGPU; v != nil {
		l.set("vgpu.present", strconv.FormatBool(v.Present))
		if v.Present && v.HostDriverVersion != "" {
			l.set("vgpu.host-driver-version", truncate(sanitise(v.HostDriverVersion)))
			l.set("vgpu.host-driver-branch", truncate(sanitise(v.HostDriverBranch)))
		}
	} else if present, ok := vgpuGuest(gpus); ok {
		// The config space could not be read whole (an unprivileged
		// container): NVML still says whether the GPUs are vGPUs, though
		// not the host's driver.
		l.set("vgpu.present", strconv.FormatBool(present))
	}
	l.set("mig.capable", strconv.FormatBool(slices.ContainsFunc(gpus, func(g nvml.GPU) bool { return g.MIGCapable })))
	// As GFD has it: true when a GPU of the node is shared through MPS.
	l.set("mps.capable", strconv.FormatBool(slices.ContainsFunc(gpus, func(g nvml.GPU) bool {
		n, _ := f.MPS.Replicas(resname.GPU, g.UUID, g.Name)
		return !g.MIGEnabled && n > 1
	})))

	model, count := majorityModel(gpus)
	// The model's labels are its first whole GPU's (MIG off) when it has
	// one, as GFD's whole-GPU labels override its MIG-mode GPUs' of the
	// same name; else its first GPU's, in MIG mode.
	first := gpus[slices.IndexFunc(gpus, func(g nvml.GPU) bool { return g.Name == model })]
	if i := slices.IndexFunc(gpus, func(g nvml.GPU) bool { return g.Name == model && !g.MIGEnabled }); i >= 0 {
		first = gpus[i]
	}
	l.addGPU(first, count, f.TimeSlicing, f.MPS)

	switch f.MIGStrategy {
	case gpu.MIGSingle:
		l.set("mig.strategy", f.MIGStrategy)
		l.addMIGSingle(gpus, model, f.TimeSlicing)
	case gpu.MIGMixed:
		l.set("mig.strategy", f.MIGStrategy)
		l.addMIGMixed(gpus, f.TimeSlicing)
	}
	return l
}

func (l Labels) set(key string, value any) { l[Prefix+key] = fmt.Sprint(value) }

// clique is gpu.clique, "<cluster UUID>.<clique ID>" of the NVLink domain
// the node's GPUs are registered in; empty when none is, or when they name
// more than one domain or clique (a label holds one), as GFD has it. GPUs
// whose registration is unfinished or failed are not counted.
func clique(gpus []nvml.GPU) string {
	var uuids, cliques []string
	for _, g := range gpus {
		if !g.Fabric.Registered() {
			continue
		}
		if !slices.Contains(uuids, g.Fabric.ClusterUUID) {
			uuids = append(uuids, g.Fabric.ClusterUUID)
		}
		if c := strconv.FormatUint(uint64(g.Fabric.CliqueID), 10); !slices.Contains(cliques, c) {
			cliques = append(cliques, c)
		}
	}
	if len(uuids) != 1 || len(cliques) != 1 {
		return ""
	}
	return uuids[0] + "." + cliques[0]
}

// majorityModel is the model with the most GPUs, a tie going to the
// model of the lowest-indexed GPU, and its count.
func majorityModel(gpus []nvml.GPU) (string, int) {
	counts := map[string]int{}
	for _, g := range gpus {
		counts[g.Name]++
	}
	best := gpus[0].Name
	for _, g := range gpus { // in index order, so the first of equals wins
		if counts[g.Name] > counts[best] {
			best = g.Name
		}
	}
	return best, counts[best]
}

// addGPU sets the whole-GPU labels for model g, count of them. A GPU in
// MIG mode is not shared, as GFD has it: replicas 0 (only when every GPU of
// the model is in MIG mode, Compute picking a whole one where there is one).
func (l Labels) addGPU(g nvml.GPU, count int, ts sharing.TimeSlicing, mps sharing.MPS) {
	replicas, strategy, renamed := 1, SharingNone, false
	if g.MIGEnabled {
		replicas = 0
	} else if r, name := mps.Replicas(resname.GPU, g.UUID, g.Name); r > 1 {
		replicas, strategy, renamed = r, SharingMPS, name != resname.GPU
	} else if r, name := ts.Replicas(resname.GPU, g.UUID, g.Name); r > 1 {
		replicas, strategy, renamed = r, SharingTimeSlicing, name != resname.GPU
	}
	l.addResource("gpu", count, replicas, strategy, renamed, g.Name)
	if g.MemoryBytes > 0 {
		l.set("gpu.memory", g.MemoryBytes>>20)
	}
	if major, minor, ok := computeCapability(g.CUDAComputeCapability); ok && major > 0 {
		l.set("gpu.family", family(major, minor))
		l.set("gpu.compute.major", major)
		l.set("gpu.compute.minor", minor)
	}
}

// addResource sets a resource's product, count, replicas and sharing
// strategy (Sharing*) under its prefix ("gpu", "mig-1g.10gb").
func (l Labels) addResource(prefix string, count, replicas int, strategy string, renamed bool, product ...string) {
	name := productName(product...)
	if strategy != SharingNone && !renamed {
		name += "-SHARED"
	}
	l.set(prefix+".product", name)
	l.set(prefix+".count", count)
	l.set(prefix+".replicas", replicas)
	l.set(prefix+".sharing-strategy", strategy)
}

// addMIGAttributes sets a MIG device's share of its GPU under prefix.
func (l Labels) addMIGAttributes(prefix string, m nvml.MIGDevice) {
	l.set(prefix+".memory", m.MemoryBytes>>20)
	l.set(prefix+".multiprocessors", m.Multiprocessors)
	l.set(prefix+".slices.gi", m.Slices.GPUInstance)
	l.set(prefix+".slices.ci", m.Slices.ComputeInstance)
	l.set(prefix+".engines.copy", m.Engines.Copy)
	l.set(prefix+".engines.decoder", m.Engines.Decoder)
	l.set(prefix+".engines.encoder", m.Engines.Encoder)
	l.set(prefix+".engines.jpeg", m.Engines.JPEG)
	l.set(prefix+".engines.ofa", m.Engines.OFA)
}

// migDevice is a MIG device with its GPU's model.
type migDevice struct {
	nvml.MIGDevice
	model string
}

// migDevices are the MIG devices of every GPU, by profile, in GPU order.
func migDevices(gpus []nvml.GPU) (profiles []string, byProfile map[string][]migDevice) {
	byProfile = map[string][]migDevice{}
	for _, g := range gpus {
		for _, m := range g.MIG {
			if _, ok := byProfile[m.Profile]; !ok {
				profiles = append(profiles, m.Profile)
			}
			byProfile[m.Profile] = append(byProfile[m.Profile], migDevice{m, g.Name})
		}
	}
	slices.Sort(profiles)
	return profiles, byProfile
}

// addMIGSingle overrides the gpu.* labels with the MIG devices', as the
// single strategy serves them as nvidia.com/gpu; a node the strategy does
// not fit is labelled <model>-MIG-INVALID with no count.
func (l Labels) addMIGSingle(gpus []nvml.GPU, model string, ts sharing.TimeSlicing) {
	var on []nvml.GPU
	for _, g := range gpus {
		if g.MIGEnabled {
			on = append(on, g)
		}
	}
	if len(on) == 0 {
		return
	}
	profiles, byProfile := migDevices(gpus)
	invalid := len(on) != len(gpus) || len(profiles) != 1 ||
		slices.ContainsFunc(on, func(g nvml.GPU) bool { return len(g.MIG) == 0 })
	if invalid {
		l.set("gpu.product", productName(on[0].Name, "MIG", "INVALID"))
		l.set("gpu.count", 0)
		l.set("gpu.replicas", 0)
		l.set("gpu.sharing-strategy", "")
		l.set("gpu.memory", 0)
		return
	}
	devs := byProfile[profiles[0]]
	l.addMIGResource("gpu", profiles[0], devs, ts, resname.GPU)
}

// addMIGMixed sets nvidia.com/mig-<profile>.* for each profile.
func (l Labels) addMIGMixed(gpus []nvml.GPU, ts sharing.TimeSlicing) {
	profiles, byProfile := migDevices(gpus)
	for _, p := range profiles {
		// The resource's name: "+" is no more allowed in a label key.
		resource := resname.MIG(p)
		l.addMIGResource(strings.TrimPrefix(resource, Prefix), p, byProfile[p], ts, resource)
	}
}

func (l Labels) addMIGResource(prefix, profile string, devs []migDevice, ts sharing.TimeSlicing, resource string) {
	first := devs[0]
	replicas, strategy, renamed := 1, SharingNone, false
	if r, name := ts.Replicas(resource, first.UUID, first.model); r > 1 {
		replicas, strategy, renamed = r, SharingTimeSlicing, name != resource
	}
	// GFD names the profile as its resource does, "+" as "." (1g.10gb.me).
	l.addResource(prefix, len(devs), replicas, strategy, renamed, first.model, "MIG", strings.ReplaceAll(profile, "+", "."))
	l.addMIGAttributes(prefix, first.MIGDevice)
}

// addVersions sets the driver's and CUDA's versions, under both the names
// GFD uses now and the older ones it keeps.
func (l Labels) addVersions(inv *nvml.Inventory) {
	parts := strings.Split(inv.DriverVersion, ".")
	if len(parts) == 2 || len(parts) == 3 {
		rev := ""
		if len(parts) == 3 {
			rev = parts[2]
		}
		l.set("cuda.driver.major", parts[0])
		l.set("cuda.driver.minor", parts[1])
		l.set("cuda.driver.rev", rev)
		l.set("cuda.driver-version.major", parts[0])
		l.set("cuda.driver-version.minor", parts[1])
		l.set("cuda.driver-version.revision", rev)
		l.set("cuda.driver-version.full", inv.DriverVersion)
	}
	if v := inv.CUDADriverVersion; v > 0 {
		major, minor := v/1000, v%1000/10
		l.set("cuda.runtime.major", major)
		l.set("cuda.runtime.minor", minor)
		l.set("cuda.runtime-version.major", major)
		l.set("cuda.runtime-version.minor", minor)
		l.set("cuda.runtime-version.full", fmt.Sprintf("%d.%d", major, minor))
	}
}

// mode is "compute" or "graphics" when every GPU's PCI class says so.
func mode(gpus []nvml.GPU, classes map[string]uint32) string {
	var seen []uint32
	for _, g := range gpus {
		c, ok := classes[g.PCIBusID]
		if !ok {
			return "unknown"
		}
		if !slices.Contains(seen, c) {
			seen = append(seen, c)
		}
	}
	if len(seen) != 1 {
		return "unknown"
	}
	switch seen[0] {
	case class3D:
		return "compute"
	case classVGA:
		return "graphics"
	}
	return "unknown"
}

func computeCapability(cc string) (major, minor int, ok bool) {
	a, b, found := strings.Cut(cc, ".")
	if !found {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(a)
	minor, err2 := strconv.Atoi(b)
	return major, minor, err1 == nil && err2 == nil
}

// family names the architecture by compute capability, as GFD does
// (NVML's own architecture names differ: "ada" for GFD's "ada-lovelace").
func family(major, minor int) string {
	switch major {
	case 1:
		return "tesla"
	case 2:
		return "fermi"
	case 3:
		return "kepler"
	case 5:
		return "maxwell"
	case 6:
		return "pascal"
	case 7:
		if minor < 5 {
			return "volta"
		}
		return "turing"
	case 8:
		if minor < 9 {
			return "ampere"
		}
		return "ada-lovelace"
	case 9:
		return "hopper"
	case 10, 12:
		return "blackwell"
	case 13:
		return "rubin"
	}
	return "undefined"
}

// productName joins the non-empty parts, each cleaned for a label value.
func productName(parts ...string) string {
	var out []string
	for _, p := range parts {
		if s := sanitise(p); s != "" {
			out = append(out, s)
		}
	}
	return strings.Join(out, "-")
}

// sanitise keeps letters, digits, '-', '_' and '.', and turns runs of
// blanks into one '-': "NVIDIA H100 80GB HBM3" is "NVIDIA-H100-80GB-HBM3".
func sanitise(s string) string {
	kept := strings.Map(func(r rune) rune {
		if r < 128 && (r == '-' || r == '_' || r == '.' || r == ' ' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return r
		}
		if r == '\t' || r == '\n' {
			return ' '
		}
		return -1
	}, s)
	return strings.Join(strings.Fields(kept), "-")
}

func orUnknown(s string) string { return cmp.Or(s, "unknown") }

// truncate fits a value into a label's 63 characters, ending with a
// letter or digit: a DMI product name is whatever its vendor wrote.
func truncate(s string) string {
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.TrimRight(s, "-_.")
}

// validValue is a Kubernetes label value: at most 63 characters, letters,
// digits, '-', '_' and '.', beginning and ending with a letter or digit.
var validValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)

// validName is the name part of a label key, after its prefix.
var validName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// Invalid returns the keys Kubernetes would refuse, for their name or
// their value.
func (l Labels) Invalid() []string {
	var bad []string
	for _, k := range l.Keys() {
		if !validName.MatchString(strings.TrimPrefix(k, Prefix)) || !validValue.MatchString(l[k]) {
			bad = append(bad, k)
		}
	}
	return bad
}

// vgpuGuest says whether any GPU is a vGPU guest's, as NVML's
// virtualization mode tells; false for ok when a GPU's mode is unknown.
func vgpuGuest(gpus []nvml.GPU) (present, ok bool) {
	if len(gpus) == 0 {
		return false, false
	}
	for _, g := range gpus {
		if g.Virtualization == "" {
			return false, false
		}
		present = present || g.Virtualization == nvml.VirtualizationVGPU
	}
	return present, true
}
