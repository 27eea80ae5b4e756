package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/runtimes"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/snapshot"
)

// The types below are the `list -o json` interface: scripts read it, so
// every key is lowerCamelCase, always present (empty rather than left
// out; a GPU's mps and remediation only where it has them), listed in docs/cli.md and pinned by testdata/list.golden.json.
// newListing maps them from the node's snapshot (its nvml.GPU and sysfs.NIC
// values) field by field, so a field added there does not change the
// output by accident.

// listing is the whole output of `list`.
type listing struct {
	DriverVersion string      `json:"driverVersion"`
	NVMLVersion   string      `json:"nvmlVersion"`
	GPUs          []listedGPU `json:"gpus"`
	NICs          []listedNIC `json:"nics"`
	DRA           listedDRA   `json:"dra"`
	CDIHook       listedHook  `json:"cdiHook"`
	RuntimeDoor   listedDoor  `json:"runtimeDoor"`
	// UnmatchedGPUEntries are the excludeGPUs and includeGPUs entries
	// that name no GPU here.
	UnmatchedGPUEntries []config.UnmatchedGPU `json:"unmatchedGPUEntries"`
	// Labels are the node labels nodeLabels delivers (GFD's names).
	Labels map[string]string `json:"labels"`
}

// listedHook is the CDI hook as the GPU CDI spec would run it: path is
// cdiHookPath ("" when left out on purpose), installed whether the
// container runtime can run it there, problem why not. inUse says whether
// CDI answers are given at all (a cdi-* strategy, or DRA mode).
type listedHook struct {
	Path      string `json:"path"`
	Installed bool   `json:"installed"`
	Problem   string `json:"problem"`
	InUse     bool   `json:"inUse"`
}

func newListedHook(h snapshot.Hook) listedHook {
	return listedHook{Path: h.Path, Installed: h.Installed, Problem: h.Problem, InUse: h.InUse}
}

// listedDoor is whether any pod, even one that asks for no GPU, can see
// every GPU by setting NVIDIA_VISIBLE_DEVICES, as the container runtime
// configs under runtimeConfigRoot say (package runtimes). State is open,
// closed, unknown, or unchecked when runtimeConfigRoot is empty.
type listedDoor struct {
	State      string `json:"state"`
	Open       bool   `json:"open"`
	Reason     string `json:"reason"`
	Runtime    string `json:"runtime"`
	ConfigPath string `json:"configPath"`
	Key        string `json:"key"`
	Mode       string `json:"mode"`
	Fix        string `json:"fix"`
	Error      string `json:"error"`
}

// doorUnchecked is listedDoor's state when runtimeConfigRoot is empty.
const doorUnchecked = "unchecked"

func newListedDoor(d *runtimes.Door) listedDoor {
	if d == nil {
		return listedDoor{State: doorUnchecked}
	}
	l := listedDoor{State: string(d.State), Open: d.IsOpen(), Reason: d.Reason, Runtime: d.Runtime,
		ConfigPath: d.ConfigPath, Key: d.Key, Mode: d.Mode, Fix: d.Fix}
	if d.Err != nil {
		l.Error = d.Err.Error()
	}
	return l
}

// listedDRA is what DRA mode would publish in this node's ResourceSlices,
// so CEL selectors and constraints can be written offline. Devices are
// the ResourceSlice's device entries as the API has them (name,
// attributes, capacity, taints).
type listedDRA struct {
	Driver  string            `json:"driver"`
	Pool    string            `json:"pool"`
	Devices []draslice.Device `json:"devices"`
}

// listedGPU is one GPU row of `list`. Resource and DeviceIDs say how the
// device-plugin API serves the GPU whole under the MIG strategy and
// sharing: "" and [] when it does not (a MIG-enabled GPU under single or
// mixed is served as its MIG devices); one device ID per time-slicing
// replica.
type listedGPU struct {
	Index       int      `json:"index"`
	UUID        string   `json:"uuid"`
	Minor       int      `json:"minor"`
	Name        string   `json:"name"`
	MemoryBytes uint64   `json:"memoryBytes"`
	PCIBusID    string   `json:"pciBusID"`
	NUMANode    int      `json:"numaNode"`
	MIGEnabled  bool     `json:"migEnabled"`
	Health      string   `json:"health"`
	Reason      string   `json:"reason"`
	Resource    string   `json:"resource"`
	DeviceIDs   []string `json:"deviceIDs"`
	// Sharing is how its replicas are shared: snapshot.SharingTimeSlicing
	// or snapshot.SharingMPS; "" when it is not shared.
	Sharing string `json:"sharing"`
	// MPS is its MPS control daemon, for a GPU shared through MPS.
	MPS *listedMPS `json:"mps,omitempty"`
	// Remediation is its remediation as the running plugin saved it;
	// left out when there is none to say.
	Remediation *listedRemediation `json:"remediation,omitempty"`
	AllocatedTo []listedHolder     `json:"allocatedTo"`
	MIG         []listedMIG        `json:"mig"`
	// Fabric is its multi-node NVLink registration (GB200, GB300 NVL72);
	// left out where NVML has none.
	Fabric *listedFabric `json:"fabric,omitempty"`
}

// listedFabric is a GPU's NVLink domain registration as NVML gives it.
type listedFabric struct {
	// Clique is "<clusterUUID>.<cliqueID>", the gpu.clique label's form;
	// "" until the registration completed and succeeded.
	Clique      string `json:"clique"`
	ClusterUUID string `json:"clusterUUID"`
	CliqueID    uint32 `json:"cliqueID"`
	// State is not-started, in-progress or completed; Status NVML's error
	// when a completed registration failed, else "".
	State  string `json:"state"`
	Status string `json:"status"`
	// HealthMask is NVML's fabric health bits (0: nothing reported).
	HealthMask uint32 `json:"healthMask"`
}

func newListedFabric(f *nvml.Fabric) *listedFabric {
	if f == nil {
		return nil
	}
	l := &listedFabric{ClusterUUID: f.ClusterUUID, CliqueID: f.CliqueID, State: f.State, Status: f.Status, HealthMask: f.HealthMask}
	if f.Registered() {
		l.Clique = f.ClusterUUID + "." + strconv.FormatUint(uint64(f.CliqueID), 10)
	}
	return l
}

// listedMPS is what a GPU's MPS control daemon says of itself.
type listedMPS struct {
	// Daemon is "up" when it answers, else "down" with Error saying why.
	Daemon  string `json:"daemon"`
	Servers int    `json:"servers"`
	Clients int    `json:"clients"`
	Error   string `json:"error,omitempty"`
}

// listedRemediation is a GPU's remediation, from remediation.json in
// stateDir as the running plugin saved it on this boot: its state and
// since when (RFC 3339), the decision its faults called for and why, the
// resets its faults caused in remediation.window, and the NVLink peer
// whose reset holds it ("" none).
type listedRemediation struct {
	State    string `json:"state"`
	Decision string `json:"decision"`
	Reason   string `json:"reason"`
	Since    string `json:"since"`
	Resets   int    `json:"resets"`
	HeldFor  string `json:"heldFor"`
}

func newListedRemediation(st *remedy.Status) *listedRemediation {
	if st == nil {
		return nil
	}
	l := &listedRemediation{State: string(st.State), Decision: string(st.Decision), Reason: st.Reason, Resets: st.Resets, HeldFor: st.HeldFor}
	if !st.Since.IsZero() {
		l.Since = st.Since.UTC().Format(time.RFC3339)
	}
	return l
}

// listedMIG is one MIG device of a listed GPU; Resource and DeviceIDs as
// for GPUs ("" and [] when the MIG strategy leaves it out).
type listedMIG struct {
	UUID            string         `json:"uuid"`
	Index           int            `json:"index"`
	GPUInstance     int            `json:"gpuInstance"`
	ComputeInstance int            `json:"computeInstance"`
	Profile         string         `json:"profile"`
	MemoryBytes     uint64         `json:"memoryBytes"`
	Multiprocessors int            `json:"multiprocessors"`
	CapMinors       []int          `json:"capMinors"`
	Health          string         `json:"health"`
	Reason          string         `json:"reason"`
	Resource        string         `json:"resource"`
	DeviceIDs       []string       `json:"deviceIDs"`
	Sharing         string         `json:"sharing"`
	AllocatedTo     []listedHolder `json:"allocatedTo"`
}

// listedHolder is a container holding a device, as the kubelet's
// PodResources API says.
type listedHolder struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
}

// listedHolders maps holders to their JSON form: [] when none.
func listedHolders(hs []podresources.Holder) []listedHolder {
	out := make([]listedHolder, len(hs))
	for i, h := range hs {
		out[i] = listedHolder{Namespace: h.Namespace, Pod: h.Pod, Container: h.Container}
	}
	return out
}

// listedNIC is one NIC row of `list`: every NIC found, pooled or not.
// Pool, Health and Reason are empty for a NIC in no pool: nothing serves
// it, so nothing judges it.
type listedNIC struct {
	Address      string          `json:"address"`
	Vendor       string          `json:"vendor"`
	Device       string          `json:"device"`
	VendorName   string          `json:"vendorName"`
	DeviceName   string          `json:"deviceName"`
	Class        string          `json:"class"`
	Driver       string          `json:"driver"`
	NUMANode     int             `json:"numaNode"`
	Netdevs      []string        `json:"netdevs"`
	LinkUp       map[string]bool `json:"linkUp"`
	LinkType     string          `json:"linkType"`
	IBDevices    []string        `json:"ibDevices"`
	RDMADevices  []string        `json:"rdmaDevices"`
	IOMMUGroup   string          `json:"iommuGroup"`
	PF           string          `json:"pf"`
	VFs          []string        `json:"vfs"`
	NumVFs       int             `json:"numVFs"`
	DefaultRoute bool            `json:"defaultRoute"`
	Failed       string          `json:"failed"`
	Problems     []string        `json:"problems"`
	Pool         string          `json:"pool"`
	Health       string          `json:"health"`
	Reason       string          `json:"reason"`
	AllocatedTo  []listedHolder  `json:"allocatedTo"`
}

// healthExcluded is the health column of a GPU the settings leave out.
const healthExcluded = "Excluded"

// newListing is the listing of what a look at the node saw: the one place
// the snapshot becomes list's JSON.
func newListing(n *snapshot.Node) listing {
	out := listing{DriverVersion: n.Inventory.DriverVersion, NVMLVersion: n.Inventory.NVMLVersion,
		GPUs: make([]listedGPU, 0, len(n.GPUs)), NICs: []listedNIC{},
		DRA:     listedDRA{Driver: config.DRADriverName, Pool: n.Name, Devices: n.DRA},
		CDIHook: newListedHook(n.Hook), RuntimeDoor: newListedDoor(n.Door), Labels: map[string]string{},
		UnmatchedGPUEntries: append([]config.UnmatchedGPU{}, n.Unmatched...)}
	maps.Copy(out.Labels, n.Labels)
	for _, g := range n.GPUs {
		lg := newListedGPU(g.Device, healthState(g.Healthy), g.State)
		for _, m := range g.MIG {
			lg.MIG = append(lg.MIG, newListedMIG(m))
		}
		lg.Remediation = newListedRemediation(g.Remediation)
		if s := g.MPS; s != nil {
			lg.MPS = &listedMPS{Daemon: "down", Servers: s.Servers, Clients: s.Clients}
			if s.Up {
				lg.MPS.Daemon = "up"
			}
			if s.Err != nil {
				lg.MPS.Error = s.Err.Error()
			}
		}
		out.GPUs = append(out.GPUs, lg)
	}
	// Excluded GPUs are listed so that nobody wonders where they went;
	// nothing of theirs is served, checked or labelled.
	for _, g := range n.Excluded {
		out.GPUs = append(out.GPUs, newListedGPU(g, healthExcluded, snapshot.State{Reason: "excludeGPUs/includeGPUs"}))
	}
	slices.SortStableFunc(out.GPUs, func(a, b listedGPU) int { return a.Index - b.Index })
	for _, nic := range n.NICs {
		out.NICs = append(out.NICs, newListedNIC(nic))
	}
	return out
}

func newListedGPU(g nvml.GPU, health string, s snapshot.State) listedGPU {
	return listedGPU{
		Index: g.Index, UUID: g.UUID, Minor: g.Minor, Name: g.Name, MemoryBytes: g.MemoryBytes,
		PCIBusID: g.PCIBusID, NUMANode: g.NUMANode, MIGEnabled: g.MIGEnabled,
		Health: health, Reason: s.Reason, Resource: s.Served.Resource, DeviceIDs: orEmpty(s.Served.IDs), Sharing: s.Sharing,
		AllocatedTo: listedHolders(s.Holders), MIG: []listedMIG{}, Fabric: newListedFabric(g.Fabric),
	}
}

func newListedMIG(m snapshot.MIG) listedMIG {
	d := m.Device
	minors := make([]int, len(d.CapMinors))
	copy(minors, d.CapMinors)
	return listedMIG{
		UUID: d.UUID, Index: d.Index, GPUInstance: d.GPUInstance, ComputeInstance: d.ComputeInstance,
		Profile: d.Profile, MemoryBytes: d.MemoryBytes, Multiprocessors: d.Multiprocessors, CapMinors: minors,
		Health: healthState(m.Healthy), Reason: m.Reason, Resource: m.Served.Resource, DeviceIDs: orEmpty(m.Served.IDs), Sharing: m.Sharing,
		AllocatedTo: listedHolders(m.Holders),
	}
}

// newListedNIC is a NIC's row; health and reason stay "" outside a pool.
func newListedNIC(s snapshot.NIC) listedNIC {
	n := s.Device
	linkUp := make(map[string]bool, len(n.LinkUp))
	maps.Copy(linkUp, n.LinkUp)
	l := listedNIC{
		Address: n.Address, Vendor: n.Vendor, Device: n.Device, VendorName: n.VendorName, DeviceName: n.DeviceName,
		Class: fmt.Sprintf("0x%06x", n.Class), Driver: n.Driver, NUMANode: n.NUMANode,
		Netdevs: orEmpty(n.Netdevs), LinkUp: linkUp, LinkType: n.LinkType,
		IBDevices: orEmpty(n.IBDevices), RDMADevices: orEmpty(n.RDMADevices), IOMMUGroup: n.IOMMUGroup,
		PF: n.PF, VFs: orEmpty(n.VFs), NumVFs: n.NumVFs, DefaultRoute: n.DefaultRoute,
		Failed: n.Failed, Problems: orEmpty(n.Problems),
		Pool: s.Pool, AllocatedTo: listedHolders(s.Holders),
	}
	if s.Pool != "" {
		l.Health, l.Reason = healthState(s.Healthy), s.Reason
	}
	return l
}

// orEmpty makes a nil list [] in JSON, not null.
func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func list(c *cli.Context, open daemon.OpenFunc, stdout, stderr io.Writer) error {
	cfg, log, err := setUp(c, stderr, checkOutput)
	if err != nil {
		return err
	}
	output, _ := outputFormat(c)
	// What the DRA preview finds wanting (a PCIe root) is said in DRA's
	// words, which only DRA mode, or --dra, should hear above debug.
	showDRA := c.Bool("dra") || cfg.KubeletAPI == config.KubeletAPIDRA
	node, err := daemon.Snapshot(c.Context, cfg, open, log, daemon.SnapshotOptions{Observe: true, QuietDRA: !showDRA})
	if err != nil {
		return err
	}
	if output == "json" {
		return writeJSON(stdout, newListing(node))
	}
	return writeTable(stdout, newListing(node), showDRA)
}

func healthState(healthy bool) string {
	if healthy {
		return "Healthy"
	}
	return "Unhealthy"
}

func writeJSON(w io.Writer, l listing) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // a reason reads "thermal=92C>=slowdown 90C", not "\u003e="
	return enc.Encode(l)
}
