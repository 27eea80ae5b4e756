package mocknvml

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// maxGPUs and maxLinks are the C library's limits (MAX_GPUS, NVML_NVLINK_MAX_LINKS);
// the MIG limits are its MIG_SLICES, MAX_GI_ID and MAX_CI_ID, the profiles its gi_profiles.
const (
	maxGPUs  = 64
	maxLinks = 36

	// MaxMIGDevices is what nvmlDeviceGetMaxMigDeviceCount answers for a
	// GPU with MIG on: MIG device indexes run from 0 to 6.
	MaxMIGDevices = 7
	migSlices     = 7
	maxGIID       = 14 // the driver's caps cover gi0 to gi14
	maxCIID       = 7
	// giProfileCount is NVML_GPU_INSTANCE_PROFILE_COUNT in go-nvml v0.13's nvml.h.
	giProfileCount = 18
)

// GIProfile is a GPU instance profile the library's MIG GPUs offer.
type GIProfile struct {
	// Index is NVML's profile index (NVML_GPU_INSTANCE_PROFILE_*), what
	// nvmlDeviceGetGpuInstanceProfileInfo takes and a mig line's giprofile.
	Index int
	// ID is the profile ID an A100 or H100 driver gives it (nvidia-smi mig
	// -lgip), what nvmlGpuInstanceInfo_t.profileId holds: not the index.
	ID        int
	Slices    int
	Instances int
	// Eighths is its share of the GPU's memory, in eighths: the size of
	// each of its placements, in memory slices.
	Eighths int
	// Placements are the memory slices an instance of it can start at,
	// what nvmlDeviceGetGpuInstancePossiblePlacements answers (nvidia-smi
	// mig -lgipp on an A100 or H100).
	Placements []int
	// Multiprocessors are an H100 80GB's for the whole instance.
	Multiprocessors int
}

// GIProfiles are the library's gi_profiles, in its order.
var GIProfiles = []GIProfile{
	{Index: 0, ID: 19, Slices: 1, Instances: 7, Eighths: 1, Placements: []int{0, 1, 2, 3, 4, 5, 6}, Multiprocessors: 16}, // 1g.10gb on an H100 80GB
	{Index: 7, ID: 20, Slices: 1, Instances: 1, Eighths: 1, Placements: []int{0, 1, 2, 3, 4, 5, 6}, Multiprocessors: 16}, // 1g.10gb+me
	{Index: 9, ID: 15, Slices: 1, Instances: 4, Eighths: 2, Placements: []int{0, 2, 4, 6}, Multiprocessors: 26},          // 1g.20gb
	{Index: 1, ID: 14, Slices: 2, Instances: 3, Eighths: 2, Placements: []int{0, 2, 4}, Multiprocessors: 32},             // 2g.20gb
	{Index: 2, ID: 9, Slices: 3, Instances: 2, Eighths: 4, Placements: []int{0, 4}, Multiprocessors: 60},                 // 3g.40gb
	{Index: 3, ID: 5, Slices: 4, Instances: 1, Eighths: 4, Placements: []int{0}, Multiprocessors: 64},                    // 4g.40gb
	{Index: 4, ID: 0, Slices: 7, Instances: 1, Eighths: 8, Placements: []int{0}, Multiprocessors: 132},                   // 7g.80gb
}

// giProfile returns the profile of NVML profile index index.
func giProfile(index int) (GIProfile, bool) {
	for _, p := range GIProfiles {
		if p.Index == index {
			return p, true
		}
	}
	return GIProfile{}, false
}

// GIProfileByID returns the profile with the driver's profile ID id.
func GIProfileByID(id int) (GIProfile, bool) {
	for _, p := range GIProfiles {
		if p.ID == id {
			return p, true
		}
	}
	return GIProfile{}, false
}

// GPUInstanceID is the id the driver gives a GPU instance of p placed at
// memory slice start: ids follow placements, not creation order (the
// driver's swizzle ids, as NVIDIA's MIG user guide shows them). 0 is the
// whole GPU; 1 and 2 the halves from slice 0 and 4; 3 to 6 the quarters
// from 0, 2, 4 and 6; 7 to 14 the eighths from 0 to 7.
func (p GIProfile) GPUInstanceID(start int) int {
	switch p.Eighths {
	case 8:
		return 0
	case 4:
		return 1 + start/4
	case 2:
		return 3 + start/2
	default:
		return 7 + start
	}
}

// startOf is the placement of GPU instance id of p; false when no instance of p has that id.
func (p GIProfile) startOf(id int) (int, bool) {
	for _, s := range p.Placements {
		if p.GPUInstanceID(s) == id {
			return s, true
		}
	}
	return 0, false
}

// idRange names the ids p's instances can have, as the C library's gi_ids does.
func (p GIProfile) idRange() string {
	first, last := p.GPUInstanceID(p.Placements[0]), p.GPUInstanceID(p.Placements[len(p.Placements)-1])
	switch {
	case first == last:
		return strconv.Itoa(first)
	case last == first+1:
		return fmt.Sprintf("%d or %d", first, last)
	default:
		return fmt.Sprintf("%d to %d", first, last)
	}
}

// Profile is a machine the mock library pretends to be, as LoadProfile reads
// it from the same text file the library parses at nvmlInit.
type Profile struct {
	// Name is the file's base name without ".profile".
	Name string
	// DriverVersion, NVMLVersion and CUDADriverVersion are empty or zero
	// when the profile leaves them out (NVML then answers NOT_SUPPORTED).
	DriverVersion     string
	NVMLVersion       string
	CUDADriverVersion int
	NVSwitches        []NVSwitch
	GPUs              []GPU
	PCIe              []PCIeRule
}

// NVSwitch is a switch that GPU NVLinks can lead to.
type NVSwitch struct {
	Name string
	// BusID is the canonical lower-case sysfs form, "0000:05:00.0".
	BusID string
}

// GPU is one GPU of a profile. Optional fields the profile leaves out are
// zero ("" or 0), except NUMANode, which is -1.
type GPU struct {
	Index int
	UUID  string
	Name  string
	// BusID is the canonical lower-case sysfs form, "0000:18:00.0".
	BusID     string
	Minor     int
	MemoryMiB uint64
	NUMANode  int
	// Temperatures are in Celsius.
	Temperature  int
	SlowdownTemp int
	ShutdownTemp int
	MaxTemp      int
	// Throttle is the clocks-event-reasons mask NVML reports before any fault.
	Throttle          uint64
	Architecture      string // "hopper"
	ComputeCapability string // "9.0"
	Brand             string // "nvidia"
	PCIDeviceID       uint32 // device and vendor, 0x233010de
	// NVLinks holds the remote end of each link in link order: an NVSwitch
	// name or "gpuN". Its length is the GPU's NVLink count.
	NVLinks []string
	// MIG is "on" or "off", the GPU's MIG mode; "" when the profile leaves
	// it out (the GPU cannot do MIG: NVML answers NOT_SUPPORTED).
	MIG string
	// MIGDevices are the GPU's MIG devices (mig lines), by MIG device index.
	MIGDevices []MIGDevice
	// Unsupported are the signals and calls the GPU answers NOT_SUPPORTED
	// to, in the order Signals lists them: temp, throttle, recovery, remap,
	// drain, procs.
	Unsupported []string
	// Fabric is the GPU's NVLink-domain registration (fabric=), nil for
	// none: NVML's fabric info answers NOT_SUPPORTED.
	Fabric *Fabric
	// VGPUHost is the vGPU host's driver (vgpuhost=<version>:<branch>),
	// which WriteSysfs puts in the GPU's PCI config space as a vGPU
	// guest's vendor-specific capability; nil on bare metal.
	VGPUHost *VGPUHost
}

// Fabric is a GPU's registration with a multi-node NVLink fabric.
type Fabric struct {
	ClusterUUID string // 8-4-4-4-12 hex, as written
	CliqueID    uint32
	// State is completed, in-progress, not-started or failed (completed
	// with an error status).
	State string
}

// VGPUHost is the host driver a vGPU guest's config space names; each at
// most 10 bytes, as the capability's record holds them.
type VGPUHost struct {
	DriverVersion, DriverBranch string
}

// MIGDevice is one MIG device (a compute instance in a GPU instance) of a
// GPU with MIG on, from a mig line of the profile.
type MIGDevice struct {
	// GPU is the parent's index; Index the NVML MIG device index within it
	// (the order of the GPU's mig lines).
	GPU   int
	Index int
	UUID  string // "MIG-..."
	// GPUInstance and ComputeInstance are the instance ids NVML reports.
	GPUInstance     int
	ComputeInstance int
	// Profile is NVIDIA's name, "3g.40gb", "1c.3g.40gb", "1g.10gb+me".
	Profile string
	// GIProfileIndex is the GPU instance's NVML profile index
	// (NVML_GPU_INSTANCE_PROFILE_*), the line's giprofile; GIProfileID
	// the profile ID nvmlGpuInstanceGetInfo reports for it (GIProfiles).
	GIProfileIndex int
	GIProfileID    int
	// GIStart is the GPU instance's placement, the memory slice it starts
	// at: the one its id names (GIProfile.GPUInstanceID).
	GIStart int
	// Slices and CISlices are the GPU instance's and the compute
	// instance's slice counts.
	Slices          int
	CISlices        int
	MemoryMiB       uint64
	Multiprocessors int
	// GICapMinor and CICapMinor are the nvidia-caps minors of the GPU
	// instance's and compute instance's access capabilities (GICapMinor and
	// CICapMinor, the functions, of the parent's minor).
	GICapMinor int
	CICapMinor int
}

// MemoryBytes is the memory NVML reports for the MIG device.
func (m MIGDevice) MemoryBytes() uint64 { return m.MemoryMiB << 20 }

// CapMinors are the device's capability minors as a container gets them:
// the GPU instance's access, then the compute instance's.
func (m MIGDevice) CapMinors() []int { return []int{m.GICapMinor, m.CICapMinor} }

// The nvidia-caps minors of the two global MIG capabilities,
// /proc/driver/nvidia/capabilities/mig/config and mig/monitor.
const (
	MIGConfigCapMinor  = 1
	MIGMonitorCapMinor = 2
)

// GICapMinor is the nvidia-caps minor of gpu<gpuMinor>/mig/gi<gi>/access,
// numbered as the driver's mig-minors table does: after config and monitor,
// each GPU takes 15 GPU instances of 9 minors each, the instance's own
// access and then its compute instances ci0 to ci7.
func GICapMinor(gpuMinor, gi int) int { return 3 + gpuMinor*(maxGIID+1)*(maxCIID+2) + gi*(maxCIID+2) }

// CICapMinor is the nvidia-caps minor of gpu<gpuMinor>/mig/gi<gi>/ci<ci>/access.
func CICapMinor(gpuMinor, gi, ci int) int { return GICapMinor(gpuMinor, gi) + 1 + ci }

// Signals are the names the unsupported key takes: temperature, clocks
// event (throttle) reasons, the recovery-action field, remapped rows, and
// two groups of calls: drain states with removal and rediscovery (as in a
// vGPU guest), and the running-process lists.
func Signals() []string { return []string{"temp", "throttle", "recovery", "remap", "drain", "procs"} }

// MemoryBytes is the total memory NVML reports.
func (g GPU) MemoryBytes() uint64 { return g.MemoryMiB << 20 }

// PCIeRule says that pairs of GPUs share at least Level as their nearest
// common PCIe ancestor: every pair on one NUMA node, or every pair in GPUs.
type PCIeRule struct {
	Level    string // internal, single, multiple, hostbridge, node or system
	SameNUMA bool
	GPUs     []int
}

var (
	arches = []string{"kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"}
	brands = []string{"quadro", "tesla", "nvs", "geforce", "titan", "quadro-rtx", "nvidia-rtx", "nvidia"}
	levels = []string{"internal", "single", "multiple", "hostbridge", "node", "system"}
)

// LoadProfile parses a profile file. It accepts exactly what the C library
// accepts, and its errors read "path:line: what is wrong" like the library's.
func LoadProfile(path string) (*Profile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening profile: %w", err)
	}
	defer f.Close()
	p := &Profile{Name: strings.TrimSuffix(filepath.Base(path), ".profile")}
	ps := &parser{path: path, p: p, defaults: GPU{NUMANode: -1}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		ps.line++
		if len(sc.Text()) > 4094 {
			return nil, ps.errorf("line longer than 4094 bytes")
		}
		if err := ps.parseLine(sc.Text()); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading profile %s: %w", path, err)
	}
	// References that may point forward: GPU links and rule members.
	for _, g := range p.GPUs {
		for _, end := range g.NVLinks {
			if n, ok := gpuRef(end); ok && n >= len(p.GPUs) {
				return nil, fmt.Errorf("%s: gpu %d: nvlink to gpu%d, but there are %d GPUs", path, g.Index, n, len(p.GPUs))
			}
		}
	}
	for i, r := range p.PCIe {
		for _, g := range r.GPUs {
			if g >= len(p.GPUs) {
				return nil, fmt.Errorf("%s: pcie rule %d names a GPU index beyond the %d GPUs", path, i+1, len(p.GPUs))
			}
		}
	}
	return p, nil
}

type parser struct {
	path     string
	line     int
	p        *Profile
	defaults GPU
}

func (ps *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", ps.path, ps.line, fmt.Sprintf(format, args...))
}

func (ps *parser) parseLine(line string) error {
	tok, ok := tokenize(line)
	if !ok || len(tok) > 64 {
		return ps.errorf("unterminated quote or more than 64 words")
	}
	if len(tok) == 0 {
		return nil
	}
	p := ps.p
	switch kw := tok[0]; kw {
	case "driver", "nvml":
		if len(tok) != 2 {
			return ps.errorf("usage: %s <version>", kw)
		}
		if err := ps.checkString(kw, tok[1], 79); err != nil {
			return err
		}
		if kw == "driver" {
			p.DriverVersion = tok[1]
		} else {
			p.NVMLVersion = tok[1]
		}
	case "cuda":
		v, err := parseUint(tok[len(tok)-1], 10, 1000000)
		if len(tok) != 2 || err != nil {
			return ps.errorf("usage: cuda <version as NVML's integer, 12040 for 12.4>")
		}
		p.CUDADriverVersion = int(v)
	case "nvswitch":
		if len(tok) != 3 {
			return ps.errorf("usage: nvswitch <name> <PCI address>")
		}
		if len(p.NVSwitches) == 64 {
			return ps.errorf("more than 64 nvswitches")
		}
		name := tok[1]
		if strings.HasPrefix(name, "gpu") {
			return ps.errorf("nvswitch %s: names starting with gpu are kept for GPU links", name)
		}
		for _, s := range p.NVSwitches {
			if s.Name == name {
				return ps.errorf("nvswitch %s declared twice", name)
			}
		}
		if err := ps.checkString("nvswitch name", name, 31); err != nil {
			return err
		}
		bus, err := parseBus(tok[2])
		if err != nil {
			return ps.errorf("nvswitch %s: %s is not a PCI address like 0000:05:00.0", name, tok[2])
		}
		p.NVSwitches = append(p.NVSwitches, NVSwitch{Name: name, BusID: bus})
	case "defaults":
		_, err := ps.parseGPUKeys(tok[1:], &ps.defaults, false)
		return err
	case "gpu":
		if len(p.GPUs) == maxGPUs {
			return ps.errorf("more than %d GPUs", maxGPUs)
		}
		var idx uint64
		var err error
		if len(tok) >= 2 {
			idx, err = parseUint(tok[1], 10, maxGPUs-1)
		}
		if len(tok) < 2 || err != nil {
			return ps.errorf("usage: gpu <index> key=value...")
		}
		if int(idx) != len(p.GPUs) {
			return ps.errorf("gpu %d: GPUs must be listed in index order, expected gpu %d", idx, len(p.GPUs))
		}
		g := ps.defaults
		g.NVLinks = append([]string(nil), ps.defaults.NVLinks...)
		g.Index = int(idx)
		identity, err := ps.parseGPUKeys(tok[2:], &g, true)
		if err != nil {
			return err
		}
		if identity != 3 {
			return ps.errorf("gpu %d: uuid, bus and minor are required", idx)
		}
		for i, o := range p.GPUs {
			switch {
			case o.UUID == g.UUID:
				return ps.errorf("gpu %d: uuid %s is also gpu %d's", idx, g.UUID, i)
			case o.BusID == g.BusID:
				return ps.errorf("gpu %d: bus is also gpu %d's", idx, i)
			case o.Minor == g.Minor:
				return ps.errorf("gpu %d: minor %d is also gpu %d's", idx, g.Minor, i)
			}
		}
		for _, s := range p.NVSwitches {
			if s.BusID == g.BusID {
				return ps.errorf("gpu %d: bus is also nvswitch %s's", idx, s.Name)
			}
		}
		p.GPUs = append(p.GPUs, g)
	case "mig":
		return ps.parseMIG(tok)
	case "pcie":
		if len(tok) < 3 {
			return ps.errorf("usage: pcie <level> same-numa | pcie <level> <GPU indexes>")
		}
		if len(p.PCIe) == 128 {
			return ps.errorf("more than 128 pcie rules")
		}
		r := PCIeRule{Level: tok[1]}
		if !contains(levels, r.Level) {
			return ps.errorf("pcie: level %s is not one of internal single multiple hostbridge node system", r.Level)
		}
		if len(tok) == 3 && tok[2] == "same-numa" {
			r.SameNUMA = true
		} else {
			gpus, err := ps.parseMembers(tok[2:])
			if err != nil {
				return err
			}
			r.GPUs = gpus
		}
		p.PCIe = append(p.PCIe, r)
	default:
		return ps.errorf("unknown keyword %s (want driver, nvml, cuda, nvswitch, defaults, gpu, mig or pcie)", kw)
	}
	return nil
}

func (ps *parser) checkString(key, val string, max int) error {
	if val == "" {
		return ps.errorf("%s is empty", key)
	}
	if len(val) > max {
		return ps.errorf("%s %.40s... is longer than %d bytes", key, val, max)
	}
	return nil
}

var clusterUUID = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// parseFabric reads <cluster UUID>:<clique ID>[:<state>], as mocknvml.c's
// parse_fabric does.
func (ps *parser) parseFabric(val string) (*Fabric, error) {
	parts := strings.Split(val, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return nil, ps.errorf("fabric %s is not <cluster UUID>:<clique ID>[:<state>]", val)
	}
	if !clusterUUID.MatchString(parts[0]) {
		return nil, ps.errorf("fabric: cluster UUID %s is not 8-4-4-4-12 hex digits", parts[0])
	}
	clique, err := parseUint(parts[1], 10, 0xffffffff)
	if err != nil {
		return nil, ps.errorf("fabric: clique ID %s is not a number", parts[1])
	}
	f := &Fabric{ClusterUUID: parts[0], CliqueID: uint32(clique), State: "completed"}
	if len(parts) == 3 {
		switch parts[2] {
		case "completed", "in-progress", "not-started", "failed":
			f.State = parts[2]
		default:
			return nil, ps.errorf("fabric: state %s is not one of completed in-progress not-started failed", parts[2])
		}
	}
	return f, nil
}

// parseGPUKeys applies key=value words to g and counts the identity keys
// (uuid, bus, minor) it saw, which only gpu lines may carry.
func (ps *parser) parseGPUKeys(words []string, g *GPU, identity bool) (int, error) {
	seen := map[string]bool{}
	for _, w := range words {
		key, val, ok := strings.Cut(w, "=")
		if !ok {
			return 0, ps.errorf("%s: expected key=value", w)
		}
		if !identity && (key == "uuid" || key == "bus" || key == "minor") {
			return 0, ps.errorf("%s belongs on each gpu line, not in defaults", key)
		}
		switch key {
		case "uuid":
			if err := ps.checkString(key, val, 79); err != nil {
				return 0, err
			}
			if !strings.HasPrefix(val, "GPU-") {
				return 0, ps.errorf("uuid %s does not start with GPU-", val)
			}
			g.UUID = val
		case "name":
			if err := ps.checkString(key, val, 95); err != nil {
				return 0, err
			}
			g.Name = val
		case "bus":
			bus, err := parseBus(val)
			if err != nil {
				return 0, ps.errorf("bus %s is not a PCI address like 0000:18:00.0", val)
			}
			g.BusID = bus
		case "minor":
			v, err := parseUint(val, 10, 255)
			if err != nil {
				return 0, ps.errorf("minor %s is not a number from 0 to 255", val)
			}
			g.Minor = int(v)
		case "memory":
			v, err := parseUint(val, 10, 1<<40)
			if err != nil || v == 0 {
				return 0, ps.errorf("memory %s is not a size in MiB", val)
			}
			g.MemoryMiB = v
		case "numa":
			v, err := parseUint(val, 10, 1023)
			if err != nil {
				return 0, ps.errorf("numa %s is not a NUMA node number", val)
			}
			g.NUMANode = int(v)
		case "temp", "slowdown", "shutdown", "maxtemp":
			v, err := parseUint(val, 10, 200)
			if err != nil {
				return 0, ps.errorf("%s %s is not a temperature from 0 to 200 C", key, val)
			}
			switch key {
			case "temp":
				g.Temperature = int(v)
			case "slowdown":
				g.SlowdownTemp = int(v)
			case "shutdown":
				g.ShutdownTemp = int(v)
			default:
				g.MaxTemp = int(v)
			}
		case "throttle":
			v, err := parseUint(val, 16, ^uint64(0))
			if err != nil {
				return 0, ps.errorf("throttle %s is not a hex mask", val)
			}
			g.Throttle = v
		case "arch":
			if !contains(arches, val) {
				return 0, ps.errorf("arch %s is not one of %s", val, strings.Join(arches, " "))
			}
			g.Architecture = val
		case "brand":
			if !contains(brands, val) {
				return 0, ps.errorf("brand %s is not one of %s", val, strings.Join(brands, " "))
			}
			g.Brand = val
		case "cc":
			major, minor, ok := strings.Cut(val, ".")
			_, err1 := parseUint(major, 10, 99)
			_, err2 := parseUint(minor, 10, 99)
			if !ok || len(major) >= 16 || err1 != nil || err2 != nil {
				return 0, ps.errorf("cc %s is not major.minor like 9.0", val)
			}
			g.ComputeCapability = val
		case "pciid":
			v, err := parseUint(val, 16, 0xffffffff)
			if err != nil {
				return 0, ps.errorf("pciid %s is not a hex device+vendor id like 0x233010de", val)
			}
			g.PCIDeviceID = uint32(v)
		case "nvlink":
			links, err := ps.parseNVLinks(val)
			if err != nil {
				return 0, err
			}
			g.NVLinks = links
		case "mig":
			if val != "on" && val != "off" {
				return 0, ps.errorf("mig %s is not on or off", val)
			}
			g.MIG = val
		case "unsupported":
			sigs, err := ps.parseUnsupported(val)
			if err != nil {
				return 0, err
			}
			g.Unsupported = sigs
		case "fabric":
			f, err := ps.parseFabric(val)
			if err != nil {
				return 0, err
			}
			g.Fabric = f
		case "vgpuhost":
			version, branch, ok := strings.Cut(val, ":")
			if !ok || version == "" || branch == "" || len(version) > 10 || len(branch) > 10 {
				return 0, ps.errorf("vgpuhost %s is not <driver version>:<branch>, each at most 10 bytes, like 550.54.16:r550_00", val)
			}
			g.VGPUHost = &VGPUHost{DriverVersion: version, DriverBranch: branch}
		default:
			return 0, ps.errorf("unknown key %s", key)
		}
		if key == "uuid" || key == "bus" || key == "minor" {
			seen[key] = true
		}
	}
	return len(seen), nil
}

// migKeys are the keys of a mig line, every one required.
var migKeys = []string{"gi", "ci", "profile", "giprofile", "slices", "cislices", "memory", "sms", "uuid"}

// parseMIG reads "mig <gpu index> key=value..." into the GPU's next MIG
// device and checks it against the GPU and its other MIG devices: the lines
// of one GPU instance agree on what the instance is, its compute instances
// fit in its slices, and its GPU instances fit in the GPU's.
func (ps *parser) parseMIG(tok []string) error {
	var idx uint64
	var err error
	if len(tok) >= 2 {
		idx, err = parseUint(tok[1], 10, maxGPUs-1)
	}
	if len(tok) < 2 || err != nil {
		return ps.errorf("usage: mig <gpu index> gi= ci= profile= giprofile= slices= cislices= memory= sms= uuid=")
	}
	if int(idx) >= len(ps.p.GPUs) {
		return ps.errorf("mig %d: no gpu %d above this line", idx, idx)
	}
	g := &ps.p.GPUs[idx]
	if g.MIG != "on" {
		return ps.errorf("mig %d: gpu %d does not have mig=on", idx, idx)
	}
	m := MIGDevice{GPU: int(idx), Index: len(g.MIGDevices)}
	seen := map[string]bool{}
	for _, w := range tok[2:] {
		key, val, ok := strings.Cut(w, "=")
		if !ok {
			return ps.errorf("%s: expected key=value", w)
		}
		switch key {
		case "gi", "ci":
			max, what := uint64(maxGIID), "GPU"
			if key == "ci" {
				max, what = maxCIID, "compute"
			}
			v, err := parseUint(val, 10, max)
			if err != nil {
				return ps.errorf("%s %s is not a %s instance id from 0 to %d", key, val, what, max)
			}
			if key == "gi" {
				m.GPUInstance = int(v)
			} else {
				m.ComputeInstance = int(v)
			}
		case "profile":
			if err := ps.checkString(key, val, 31); err != nil {
				return err
			}
			m.Profile = val
		case "giprofile":
			v, err := parseUint(val, 10, giProfileCount-1)
			p, ok := giProfile(int(v))
			if err != nil || !ok {
				return ps.errorf("giprofile %s is not an NVML GPU instance profile index the mock offers (0-4, 7, 9)", val)
			}
			m.GIProfileIndex, m.GIProfileID = p.Index, p.ID
		case "slices", "cislices":
			v, err := parseUint(val, 10, migSlices)
			if err != nil || v == 0 {
				return ps.errorf("%s %s is not a slice count from 1 to %d", key, val, migSlices)
			}
			if key == "slices" {
				m.Slices = int(v)
			} else {
				m.CISlices = int(v)
			}
		case "memory":
			v, err := parseUint(val, 10, 1<<40)
			if err != nil || v == 0 {
				return ps.errorf("memory %s is not a size in MiB", val)
			}
			m.MemoryMiB = v
		case "sms":
			v, err := parseUint(val, 10, 65535)
			if err != nil || v == 0 {
				return ps.errorf("sms %s is not a multiprocessor count from 1 to 65535", val)
			}
			m.Multiprocessors = int(v)
		case "uuid":
			if err := ps.checkString(key, val, 79); err != nil {
				return err
			}
			if !strings.HasPrefix(val, "MIG-") {
				return ps.errorf("uuid %s does not start with MIG-", val)
			}
			m.UUID = val
		default:
			return ps.errorf("mig: unknown key %s", key)
		}
		seen[key] = true
	}
	if len(seen) != len(migKeys) {
		return ps.errorf("mig %d: gi, ci, profile, giprofile, slices, cislices, memory, sms and uuid are required", idx)
	}
	if p, _ := giProfile(m.GIProfileIndex); m.Slices != p.Slices {
		return ps.errorf("mig %d: giprofile %d has %d slices, not %d", idx, m.GIProfileIndex, p.Slices, m.Slices)
	}
	if m.CISlices > m.Slices {
		return ps.errorf("mig %d: cislices %d is more than slices %d", idx, m.CISlices, m.Slices)
	}
	if g.MemoryMiB != 0 && m.MemoryMiB > g.MemoryMiB {
		return ps.errorf("mig %d: memory %d MiB is more than the GPU's %d MiB", idx, m.MemoryMiB, g.MemoryMiB)
	}
	for i, o := range ps.p.GPUs {
		for j, om := range o.MIGDevices {
			if om.UUID == m.UUID {
				return ps.errorf("mig %d: uuid %s is also gpu %d's MIG device %d", idx, m.UUID, i, j)
			}
		}
	}
	ciSlices, giSlices, newGI := m.CISlices, m.Slices, true
	counted := map[int]bool{m.GPUInstance: true}
	var others []MIGDevice // the first line of each other GPU instance
	for _, o := range g.MIGDevices {
		if o.GPUInstance != m.GPUInstance {
			if !counted[o.GPUInstance] {
				counted[o.GPUInstance] = true
				giSlices += o.Slices
				others = append(others, o)
			}
			continue
		}
		newGI = false
		if o.ComputeInstance == m.ComputeInstance {
			return ps.errorf("mig %d: gi %d ci %d is declared twice", idx, m.GPUInstance, m.ComputeInstance)
		}
		if o.GIProfileIndex != m.GIProfileIndex || o.Slices != m.Slices || o.MemoryMiB != m.MemoryMiB {
			return ps.errorf("mig %d: gi %d differs from its earlier line in giprofile, slices or memory", idx, m.GPUInstance)
		}
		ciSlices += o.CISlices
	}
	if ciSlices > m.Slices {
		return ps.errorf("mig %d: the compute instances of gi %d take more than its %d slices", idx, m.GPUInstance, m.Slices)
	}
	if newGI && giSlices > migSlices {
		return ps.errorf("mig %d: its GPU instances take more than %d slices", idx, migSlices)
	}
	p, _ := giProfile(m.GIProfileIndex)
	start, ok := p.startOf(m.GPUInstance)
	if newGI && !ok {
		return ps.errorf("mig %d: gi %d is not an id a giprofile %d GPU instance has (%s)", idx, m.GPUInstance, m.GIProfileIndex, p.idRange())
	}
	m.GIStart = start
	if newGI {
		same := 0
		for _, o := range others {
			op, _ := giProfile(o.GIProfileIndex)
			if start < o.GIStart+op.Eighths && o.GIStart < start+p.Eighths {
				return ps.errorf("mig %d: gi %d and gi %d overlap in memory", idx, m.GPUInstance, o.GPUInstance)
			}
			if o.GIProfileIndex == m.GIProfileIndex {
				same++
			}
		}
		if same == p.Instances {
			return ps.errorf("mig %d: more than %d GPU instances of giprofile %d", idx, p.Instances, m.GIProfileIndex)
		}
	}
	m.GICapMinor = GICapMinor(g.Minor, m.GPUInstance)
	m.CICapMinor = CICapMinor(g.Minor, m.GPUInstance, m.ComputeInstance)
	g.MIGDevices = append(g.MIGDevices, m)
	return nil
}

// parseNVLinks reads "end*count,end,..." where end is a declared switch or gpuN.
func (ps *parser) parseNVLinks(val string) ([]string, error) {
	if val == "none" {
		return nil, nil
	}
	var links []string
	for item := range strings.SplitSeq(val, ",") {
		if item == "" {
			continue // the C parser's strtok skips empty items
		}
		end, countStr, starred := strings.Cut(item, "*")
		count := uint64(1)
		if starred {
			c, err := parseUint(countStr, 10, maxLinks)
			if err != nil || c == 0 {
				return nil, ps.errorf("nvlink: %s*%s: the count must be 1 to %d", end, countStr, maxLinks)
			}
			count = c
		}
		known := false
		for _, s := range ps.p.NVSwitches {
			known = known || s.Name == end
		}
		if _, isGPU := gpuRef(end); !known && !isGPU {
			return nil, ps.errorf("nvlink: %s is neither an nvswitch declared above nor gpuN", end)
		}
		if len(links)+int(count) > maxLinks {
			return nil, ps.errorf("nvlink: more than %d links", maxLinks)
		}
		for range count {
			links = append(links, end)
		}
	}
	if len(links) == 0 {
		return nil, ps.errorf("nvlink: empty list (write nvlink=none for a GPU without NVLink)")
	}
	return links, nil
}

// parseUnsupported reads "temp,throttle,recovery,remap,drain,procs" or "none".
func (ps *parser) parseUnsupported(val string) ([]string, error) {
	if val == "none" {
		return nil, nil
	}
	set := map[string]bool{}
	for item := range strings.SplitSeq(val, ",") {
		if item == "" {
			continue // the C parser's strtok skips empty items
		}
		if !contains(Signals(), item) {
			return nil, ps.errorf("unsupported: %s is not one of temp throttle recovery remap drain procs", item)
		}
		set[item] = true
	}
	var out []string
	for _, s := range Signals() {
		if set[s] {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, ps.errorf("unsupported: empty list (write unsupported=none for none)")
	}
	return out, nil
}

// gpuRef reports whether an NVLink end names a GPU ("gpu3"), and which.
func gpuRef(end string) (int, bool) {
	s, ok := strings.CutPrefix(end, "gpu")
	if !ok {
		return 0, false
	}
	n, err := parseUint(s, 10, maxGPUs-1)
	return int(n), err == nil
}

// parseMembers reads GPU indexes and ranges: "0 1", "0-3", "0,2,4-5".
func (ps *parser) parseMembers(words []string) ([]int, error) {
	var set [maxGPUs]bool
	for _, w := range words {
		for item := range strings.SplitSeq(w, ",") {
			if item == "" {
				continue
			}
			loStr, hiStr, isRange := strings.Cut(item, "-")
			lo, err := parseUint(loStr, 10, maxGPUs-1)
			if err != nil {
				return nil, ps.errorf("pcie: %s is not a GPU index", w)
			}
			hi := lo
			if isRange {
				if hi, err = parseUint(hiStr, 10, maxGPUs-1); err != nil || hi < lo {
					return nil, ps.errorf("pcie: %s is not a GPU range like 0-3", w)
				}
			}
			for g := lo; g <= hi; g++ {
				set[g] = true
			}
		}
	}
	var gpus []int
	for g, in := range set {
		if in {
			gpus = append(gpus, g)
		}
	}
	if len(gpus) == 0 {
		return nil, ps.errorf("pcie: no GPUs given (list indexes like 0 1 or 0-3, or write same-numa)")
	}
	return gpus, nil
}

// tokenize splits a line on blanks; a double-quoted run keeps its blanks and
// loses its quotes, and # outside quotes starts a comment. ok is false for
// an unterminated quote.
func tokenize(line string) (tok []string, ok bool) {
	var cur strings.Builder
	inTok, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '"':
			quoted = !quoted
			inTok = true
		case !quoted && (c == ' ' || c == '\t' || c == '\r' || c == '\n'):
			if inTok {
				tok = append(tok, cur.String())
				cur.Reset()
				inTok = false
			}
		case !quoted && c == '#':
			if inTok {
				tok = append(tok, cur.String())
			}
			return tok, true
		default:
			cur.WriteByte(c)
			inTok = true
		}
	}
	if quoted {
		return nil, false
	}
	if inTok {
		tok = append(tok, cur.String())
	}
	return tok, true
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

var errSyntax = errors.New("malformed number")

// parseUint parses a whole unsigned number; base 16 takes an optional 0x.
func parseUint(s string, base int, max uint64) (uint64, error) {
	if base == 16 {
		if t, ok := strings.CutPrefix(strings.ToLower(s), "0x"); ok {
			s = t
		}
	}
	if s == "" || s[0] == '+' || s[0] == '-' {
		return 0, errSyntax
	}
	v, err := strconv.ParseUint(s, base, 64)
	if err != nil || v > max {
		return 0, errSyntax
	}
	return v, nil
}

// parseBus accepts [domain:]bus:device.function in hex and returns the
// canonical lower-case sysfs form.
func parseBus(s string) (string, error) {
	rest, fnStr, ok := strings.Cut(s, ".")
	if !ok || strings.ContainsAny(fnStr, ".:") {
		return "", errSyntax
	}
	parts := strings.Split(rest, ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return "", errSyntax
	}
	parts = append(parts, fnStr)
	width := []int{8, 2, 2, 1}
	max := []uint64{0xffffffff, 0xff, 0x1f, 0x7}
	var v [4]uint64
	for i, part := range parts {
		if len(part) > width[i] || strings.HasPrefix(strings.ToLower(part), "0x") {
			return "", errSyntax
		}
		n, err := parseUint(part, 16, max[i])
		if err != nil {
			return "", errSyntax
		}
		v[i] = n
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", v[0], v[1], v[2], v[3]), nil
}

// WriteSysfs writes what the plugin reads from sysfs for each GPU under root
// (normally a test's temporary directory standing in for /sys):
// devices/pci<domain>:<bus>/<bus id>/numa_node and class, and vendor, device,
// resource and config when the profile gives a pciid, with bus/pci/devices/<bus id> linking there.
func (p *Profile) WriteSysfs(root string) error {
	for _, g := range p.GPUs {
		// As the kernel lays it out: the device under its root complex in
		// devices/, and bus/pci/devices/<address> a link to it, which is where
		// the PCIe root (DRA's pcieRoot attribute) is read from.
		domain, rest, _ := strings.Cut(g.BusID, ":")
		bus, _, _ := strings.Cut(rest, ":")
		dir := filepath.Join(root, "devices", "pci"+domain+":"+bus, g.BusID)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("writing sysfs for GPU %d: %w", g.Index, err)
		}
		link := filepath.Join(root, "bus", "pci", "devices", g.BusID)
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return fmt.Errorf("writing sysfs for GPU %d: %w", g.Index, err)
		}
		target, err := filepath.Rel(filepath.Dir(link), dir)
		if err == nil {
			err = os.Symlink(target, link)
		}
		if err != nil {
			return fmt.Errorf("writing sysfs for GPU %d: %w", g.Index, err)
		}
		// class: a 3D controller, as data-center GPUs are (GFD's gpu.mode).
		files := map[string]string{"numa_node": fmt.Sprintf("%d\n", g.NUMANode), "class": "0x030200\n"}
		if g.PCIDeviceID != 0 {
			files["vendor"] = fmt.Sprintf("0x%04x\n", g.PCIDeviceID&0xffff)
			files["device"] = fmt.Sprintf("0x%04x\n", g.PCIDeviceID>>16)
			// What go-nvlib's nvpci reads besides (GFD's gpu.mode and
			// vgpu.present): the BARs, and the config space header.
			files["resource"] = pciResource(g.Index)
			files["config"] = pciConfig(g.PCIDeviceID, g.VGPUHost)
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				return fmt.Errorf("writing sysfs for GPU %d: %w", g.Index, err)
			}
		}
	}
	return nil
}

// pciResource is a GPU's sysfs resource file as the kernel prints it: one
// "start end flags" line per resource (6 BARs, the expansion ROM, the 6
// SR-IOV BARs), here BAR0 16 MiB of registers, BAR1 a 64-bit prefetchable
// 64 GiB aperture and BAR3 32 MiB, each GPU at its own addresses.
func pciResource(index int) string {
	base := uint64(0x20000000000) + uint64(index)<<40
	type bar struct{ start, size, flags uint64 }
	bars := [13]bar{
		0: {0xa0000000 + uint64(index)<<24, 16 << 20, 0x40200},
		1: {base, 64 << 30, 0x14220c},
		3: {base + 64<<30, 32 << 20, 0x14220c},
	}
	var b strings.Builder
	for _, r := range bars {
		end := uint64(0)
		if r.size != 0 {
			end = r.start + r.size - 1
		}
		fmt.Fprintf(&b, "0x%016x 0x%016x 0x%016x\n", r.start, end, r.flags)
	}
	return b.String()
}

// pciConfig is the first 256 bytes of a GPU's config space: vendor and
// device IDs and the class code (3D controller). On bare metal (host nil)
// it has no capability list. A vGPU guest's has one, of one vendor-specific
// capability (ID 0x09) as NVIDIA's vGPU manager exposes it: after the
// capability's ID, next pointer and length, the signature "VF", then
// records of an ID, their length (ID and length bytes included) and data;
// record 0 holds the host driver's version and branch, 10 bytes each,
// NUL-padded.
func pciConfig(pciDeviceID uint32, host *VGPUHost) string {
	c := make([]byte, 256)
	binary.LittleEndian.PutUint32(c[0:], pciDeviceID)
	c[0x0a], c[0x0b] = 0x02, 0x03 // subclass, class: 3D controller
	if host == nil {
		return string(c)
	}
	const at = 0xd4 // where the capability sits: past the header, dword-aligned
	c[0x06] |= 0x10 // status: a capability list
	c[0x34] = at    // the list's first entry
	record := make([]byte, 2+10+10)
	record[0], record[1] = 0, byte(len(record))
	copy(record[2:12], host.DriverVersion)
	copy(record[12:22], host.DriverBranch)
	capability := append([]byte{0x09, 0x00, byte(5 + len(record)), 'V', 'F'}, record...)
	copy(c[at:], capability)
	return string(c)
}

// WriteDev creates the device nodes the plugin hands to containers, as empty
// files under root (standing in for /dev): nvidia<minor> for each GPU,
// nvidiactl, nvidia-uvm and nvidia-uvm-tools, and nvidia-caps/nvidia-cap<N>
// for every capability WriteProc describes.
func (p *Profile) WriteDev(root string) error {
	if err := os.MkdirAll(filepath.Join(root, "nvidia-caps"), 0o755); err != nil {
		return fmt.Errorf("writing dev: %w", err)
	}
	names := []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
	for _, g := range p.GPUs {
		names = append(names, fmt.Sprintf("nvidia%d", g.Minor))
	}
	for _, c := range p.migCaps() {
		names = append(names, filepath.Join("nvidia-caps", fmt.Sprintf("nvidia-cap%d", c.minor)))
	}
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(root, name), nil, 0o666); err != nil {
			return fmt.Errorf("writing dev: %w", err)
		}
	}
	return nil
}

// migCap is one nvidia capability WriteProc and WriteDev describe.
type migCap struct {
	path  string // under <procRoot>/driver/nvidia/capabilities
	minor int
	mode  os.FileMode
}

// migCaps lists the global MIG capabilities, then the access capability of
// each GPU instance (once) and compute instance of every MIG device.
func (p *Profile) migCaps() []migCap {
	// config lets its holder create and destroy instances, so only root may
	// read it; monitor and the access capabilities are world-readable, as
	// the driver sets them.
	caps := []migCap{
		{path: "mig/config", minor: MIGConfigCapMinor, mode: 0o400},
		{path: "mig/monitor", minor: MIGMonitorCapMinor, mode: 0o444},
	}
	for _, g := range p.GPUs {
		seen := map[int]bool{}
		for _, m := range g.MIGDevices {
			gi := fmt.Sprintf("gpu%d/mig/gi%d", g.Minor, m.GPUInstance)
			if !seen[m.GPUInstance] {
				seen[m.GPUInstance] = true
				caps = append(caps, migCap{path: gi + "/access", minor: m.GICapMinor, mode: 0o444})
			}
			caps = append(caps, migCap{path: fmt.Sprintf("%s/ci%d/access", gi, m.ComputeInstance), minor: m.CICapMinor, mode: 0o444})
		}
	}
	return caps
}

// Character device majors in the devices file WriteProc writes.
const (
	// NVIDIAMajor is the major of /dev/nvidia<minor> and /dev/nvidiactl,
	// fixed by the driver (195), so it is the real one.
	NVIDIAMajor = 195
	// NVIDIACapsMajor and NVIDIAUVMMajor are the majors of
	// /dev/nvidia-caps/nvidia-cap<N> and /dev/nvidia-uvm. The kernel hands
	// these out when the driver loads, so no value is the real one; they
	// read 1 because the fixture's device nodes are all 1:3 char devices
	// (e2e/cluster/fixture's deviceNodes: /dev/null's numbers, which a
	// container can open): a program that matches a capability node against
	// /proc/devices, or makes a missing one from its major and the
	// capability's minor, gets the major the fixture's nodes have.
	NVIDIACapsMajor = 1
	NVIDIAUVMMajor  = 1
	// NVIDIAIMEXMajor is nvidia-caps-imex-channels', listed only for a
	// profile with a GPU in an NVLink domain (fabric=), as a driver with
	// IMEX support lists it; 1 for the same reason as the others.
	NVIDIAIMEXMajor = 1
)

// devicesFile is /proc/devices as a node with the driver loaded lists the
// driver's character devices (and no others: nothing else reads it here).
func (p *Profile) devicesFile() string {
	imex := ""
	for _, g := range p.GPUs {
		if g.Fabric != nil {
			imex = fmt.Sprintf("%3d nvidia-caps-imex-channels\n", NVIDIAIMEXMajor)
			break
		}
	}
	return fmt.Sprintf("Character devices:\n%3d nvidia-caps\n%s%3d nvidia-uvm\n%3d nvidia\n%3d nvidiactl\n\nBlock devices:\n",
		NVIDIACapsMajor, imex, NVIDIAUVMMajor, NVIDIAMajor, NVIDIAMajor)
}

// WriteProc writes the MIG capabilities as the driver shows them under
// procRoot (standing in for /proc): driver/nvidia/capabilities/mig/config
// and mig/monitor, and for each MIG device
// driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access and
// gi<G>/ci<C>/access, each "DeviceFileMinor: <N>\nDeviceFileMode: <octal>\n"
// where N is the minor of /dev/nvidia-caps/nvidia-cap<N>; and devices,
// the character device majors (NVIDIAMajor, NVIDIACapsMajor, NVIDIAUVMMajor).
// The library adds and removes the capabilities of instances created and
// destroyed through NVML under MOCK_NVML_PROC_ROOT, which should be procRoot.
func (p *Profile) WriteProc(procRoot string) error {
	if err := os.MkdirAll(procRoot, 0o755); err != nil {
		return fmt.Errorf("writing proc: %w", err)
	}
	if err := os.WriteFile(filepath.Join(procRoot, "devices"), []byte(p.devicesFile()), 0o644); err != nil {
		return fmt.Errorf("writing proc devices: %w", err)
	}
	base := filepath.Join(procRoot, "driver", "nvidia", "capabilities")
	for _, c := range p.migCaps() {
		path := filepath.Join(base, filepath.FromSlash(c.path))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("writing proc capability %s: %w", c.path, err)
		}
		text := fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: %o\n", c.minor, c.mode)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return fmt.Errorf("writing proc capability %s: %w", c.path, err)
		}
	}
	return nil
}
