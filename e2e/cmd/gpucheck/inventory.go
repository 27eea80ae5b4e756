package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// nvidiaMajor is the character-device major of /dev/nvidia<minor>.
const nvidiaMajor = 195

// listing is the part of `list -o json` the checks read.
type listing struct {
	DriverVersion string       `json:"driverVersion"`
	NVMLVersion   string       `json:"nvmlVersion"`
	GPUs          []listedGPU  `json:"gpus"`
	CDIHook       listedHook   `json:"cdiHook"`
	DRA           listedDRASet `json:"dra"`
	// Labels are the node labels, in GPU Feature Discovery's names.
	Labels map[string]string `json:"labels"`
}

type listedGPU struct {
	Index       int         `json:"index"`
	UUID        string      `json:"uuid"`
	Minor       int         `json:"minor"`
	Name        string      `json:"name"`
	PCIBusID    string      `json:"pciBusID"`
	NUMANode    int         `json:"numaNode"`
	MemoryBytes uint64      `json:"memoryBytes"`
	MIGEnabled  bool        `json:"migEnabled"`
	Health      string      `json:"health"`
	Reason      string      `json:"reason"`
	Resource    string      `json:"resource"`
	DeviceIDs   []string    `json:"deviceIDs"`
	MIG         []listedMIG `json:"mig"`
}

type listedMIG struct {
	UUID            string `json:"uuid"`
	Profile         string `json:"profile"`
	GPUInstance     int    `json:"gpuInstance"`
	ComputeInstance int    `json:"computeInstance"`
	Multiprocessors int    `json:"multiprocessors"`
	MemoryBytes     uint64 `json:"memoryBytes"`
}

type listedHook struct {
	Installed bool   `json:"installed"`
	Problem   string `json:"problem"`
}

type listedDRASet struct {
	Devices []struct {
		Name       string                     `json:"name"`
		Attributes map[string]json.RawMessage `json:"attributes"`
	} `json:"devices"`
}

type inventoryData struct {
	Version string `json:"version"`
	// List is `list -o json` as printed.
	List json.RawMessage `json:"list"`
	// Topology is NVML's view of the links between the GPUs, from the
	// plugin's discovery run in this process.
	Topology any `json:"topology,omitempty"`
}

// inventory runs `version` and `list -o json` and checks what the plugin
// relies on against the node's own files.
func (c *checker) inventory(ctx context.Context, s *Step) {
	data := &inventoryData{}
	s.Data = data
	out, _, err := c.runPlugin(ctx, append(c.node.Args(), "version")...)
	if !s.check("version runs", err == nil, "%s", errText(err)) {
		return
	}
	data.Version = strings.TrimSpace(out)
	args := append(c.node.Args(), "--pod-resources-socket", "", "--cdi-hook-path", c.hook, "list", "-o", "json")
	out, stderr, err := c.runPlugin(ctx, args...)
	if !s.check("list -o json runs", err == nil, "%s", errText(err)) {
		return
	}
	data.List = json.RawMessage(out)
	var l listing
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		s.fail("list -o json parses", err)
		return
	}
	c.listed = &l
	s.check("warnings from list", !strings.Contains(stderr, "level=ERROR"), "%s", oneLine(stderr, 600))
	s.check("GPUs found", len(l.GPUs) > 0, "%d GPUs", len(l.GPUs))
	s.check("driver and NVML versions", l.DriverVersion != "" && l.NVMLVersion != "", "driver %q, NVML %q", l.DriverVersion, l.NVMLVersion)
	s.check("CDI hook found", l.CDIHook.Installed, "%s", l.CDIHook.Problem)
	s.check("UUIDs unique", uniqueUUIDs(l.GPUs), "%d GPUs", len(l.GPUs))
	for _, g := range l.GPUs {
		name := fmt.Sprintf("GPU %d (%s)", g.Index, g.PCIBusID)
		err := c.checkMinor(g.Minor)
		s.check(name+" minor matches /dev", err == nil, "%s", errText(err))
		want, err := sysfsNUMA(c.sysfs, g.PCIBusID)
		s.check(name+" NUMA node matches sysfs", err == nil && want == g.NUMANode, "list says %d, sysfs %d (%v)", g.NUMANode, want, err)
		s.check(name+" healthy", g.Health == "Healthy", "%s %s", g.Health, g.Reason)
	}
	c.checkLabels(s, l)
	if lib, err := c.nvml(); !s.check("NVML loads in-process", err == nil, "%s", errText(err)) {
		return
	} else {
		inv, err := nvml.Discover(lib, c.sysfs, c.logger())
		if s.check("discovery in-process", err == nil, "%s", errText(err)) {
			data.Topology = inv.Topology
			s.check("discovery agrees with list", len(inv.GPUs) == len(l.GPUs), "%d GPUs in-process, %d listed", len(inv.GPUs), len(l.GPUs))
		}
		c.checkMIG(s, lib, l.GPUs)
	}
}

func uniqueUUIDs(gpus []listedGPU) bool {
	seen := map[string]bool{}
	for _, g := range gpus {
		if g.UUID == "" || seen[g.UUID] {
			return false
		}
		seen[g.UUID] = true
		for _, m := range g.MIG {
			if m.UUID == "" || seen[m.UUID] {
				return false
			}
			seen[m.UUID] = true
		}
	}
	return true
}

// checkMinor checks /dev/nvidia<minor>: a character device, and on a real
// node the driver's numbers (a mock node's nodes are 1:3, /dev/null's).
func (c *checker) checkMinor(minor int) error {
	p := filepath.Join(c.dev, "nvidia"+strconv.Itoa(minor))
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return fmt.Errorf("%s is not a character device", p)
	}
	if c.mock {
		return nil
	}
	if maj, min := unix.Major(st.Rdev), unix.Minor(st.Rdev); maj != uint32(nvidiaMajor) || int(min) != minor {
		return fmt.Errorf("%s is %d:%d, want %d:%d", p, maj, min, nvidiaMajor, minor)
	}
	return nil
}

// sysfsNUMA reads the PCI device's numa_node; -1 where the kernel has none.
func sysfsNUMA(sysfs, busID string) (int, error) {
	p := filepath.Join(sysfs, "bus/pci/devices", strings.ToLower(busID), "numa_node")
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return max(n, -1), nil
}

// checkMIG compares each listed MIG device's profile with what NVML says
// the instance is: a profile ID read as an index names the wrong profile,
// whose slice count and multiprocessors differ.
func (c *checker) checkMIG(s *Step, lib nvml.Library, gpus []listedGPU) {
	n := 0
	for _, g := range gpus {
		for _, m := range g.MIG {
			n++
			name := fmt.Sprintf("MIG %s on GPU %d", m.Profile, g.Index)
			h, ret := lib.DeviceGetHandleByUUID(m.UUID)
			if ret != gonvml.SUCCESS {
				s.check(name+" found by UUID", false, "%s: %v", m.UUID, ret)
				continue
			}
			a, ret := h.GetAttributes()
			if ret != gonvml.SUCCESS {
				s.check(name+" attributes", false, "%v", ret)
				continue
			}
			slices, _, _ := strings.Cut(m.Profile, "g.")
			s.check(name+" profile matches its instance", slices == strconv.Itoa(int(a.GpuInstanceSliceCount)) && int(a.MultiprocessorCount) == m.Multiprocessors,
				"listed %s with %d SMs; NVML: %d slices, %d SMs", m.Profile, m.Multiprocessors, a.GpuInstanceSliceCount, a.MultiprocessorCount)
		}
	}
	if n == 0 {
		s.check("MIG profiles", true, "no MIG devices: MIG is off or has no instances")
	}
}

// checkLabels checks the node labels against the GPUs listed: the product
// is the first GPU's model (on a node of one model), the count and the
// memory are theirs.
func (c *checker) checkLabels(s *Step, l listing) {
	if !s.check("node labels computed", len(l.Labels) > 0, "%d labels", len(l.Labels)) || len(l.GPUs) == 0 {
		return
	}
	g := l.GPUs[0]
	for _, o := range l.GPUs {
		if o.Name != g.Name {
			s.check("node labels", true, "GPUs of several models: the labels describe the most numerous (docs/node-labels.md)")
			return
		}
	}
	product := strings.Join(strings.Fields(g.Name), "-")
	s.check("gpu.product names the GPU", strings.HasPrefix(l.Labels["nvidia.com/gpu.product"], product),
		"label %q, GPU %q", l.Labels["nvidia.com/gpu.product"], g.Name)
	s.check("gpu.count counts the GPUs", l.Labels["nvidia.com/gpu.count"] == strconv.Itoa(len(l.GPUs)),
		"label %q, %d GPUs", l.Labels["nvidia.com/gpu.count"], len(l.GPUs))
	s.check("driver version label", l.Labels["nvidia.com/cuda.driver-version.full"] == l.DriverVersion,
		"label %q, driver %q", l.Labels["nvidia.com/cuda.driver-version.full"], l.DriverVersion)
}
