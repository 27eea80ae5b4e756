package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/runtimes"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/layout"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/nodelabels"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/podresources"
)

// The types below are the `list -o json` interface: scripts read it, so
// every key is lowerCamelCase, always present (empty rather than left
// out), listed in docs/cli.md and pinned by testdata/list.golden.json. They
// are mapped from nvml.GPU and sysfs.NIC field by field, so a field added
// there does not change the output by accident.

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

func newListedHook(cfg config.Config) listedHook {
	h := listedHook{Path: cfg.CDIHookPath, InUse: cfg.UsesCDI()}
	if h.Path != "" {
		if err := cdi.CheckHook(h.Path); err != nil {
			h.Problem = err.Error()
		} else {
			h.Installed = true
		}
	}
	return h
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

func newListedDoor(cfg config.Config) listedDoor {
	if cfg.RuntimeConfigRoot == "" {
		return listedDoor{State: doorUnchecked}
	}
	d := runtimes.Inspect(cfg.RuntimeConfigRoot)
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
	// Sharing is how its replicas are shared: sharingTimeSlicing or
	// sharingMPS; "" when it is not shared.
	Sharing string `json:"sharing"`
	// MPS is its MPS control daemon, for a GPU shared through MPS.
	MPS         *listedMPS     `json:"mps,omitempty"`
	AllocatedTo []listedHolder `json:"allocatedTo"`
	MIG         []listedMIG    `json:"mig"`
}

// Values of a listed unit's sharing.
const (
	sharingTimeSlicing = "time-slicing"
	sharingMPS         = "mps"
)

// listedMPS is what a GPU's MPS control daemon says of itself.
type listedMPS struct {
	// Daemon is "up" when it answers, else "down" with Error saying why.
	Daemon  string `json:"daemon"`
	Servers int    `json:"servers"`
	Clients int    `json:"clients"`
	Error   string `json:"error,omitempty"`
}

func sharingOf(u gpu.Unit) string {
	switch {
	case u.MPS:
		return sharingMPS
	case u.Replicas > 1:
		return sharingTimeSlicing
	}
	return ""
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

func newListedGPU(g nvml.GPU, health, reason string, as layout.Served, holders []podresources.Holder) listedGPU {
	return listedGPU{
		Index: g.Index, UUID: g.UUID, Minor: g.Minor, Name: g.Name, MemoryBytes: g.MemoryBytes,
		PCIBusID: g.PCIBusID, NUMANode: g.NUMANode, MIGEnabled: g.MIGEnabled,
		Health: health, Reason: reason, Resource: as.Resource, DeviceIDs: orEmpty(as.IDs), Sharing: sharingOf(as.Unit),
		AllocatedTo: listedHolders(holders), MIG: []listedMIG{},
	}
}

func newListedMIG(m nvml.MIGDevice, health, reason string, as layout.Served, holders []podresources.Holder) listedMIG {
	minors := make([]int, len(m.CapMinors))
	copy(minors, m.CapMinors)
	return listedMIG{
		UUID: m.UUID, Index: m.Index, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance,
		Profile: m.Profile, MemoryBytes: m.MemoryBytes, Multiprocessors: m.Multiprocessors, CapMinors: minors,
		Health: health, Reason: reason, Resource: as.Resource, DeviceIDs: orEmpty(as.IDs), Sharing: sharingOf(as.Unit),
		AllocatedTo: listedHolders(holders),
	}
}

func newListedNIC(n sysfs.NIC, pool, health, reason string, holders []podresources.Holder) listedNIC {
	linkUp := make(map[string]bool, len(n.LinkUp))
	maps.Copy(linkUp, n.LinkUp)
	return listedNIC{
		Address: n.Address, Vendor: n.Vendor, Device: n.Device, VendorName: n.VendorName, DeviceName: n.DeviceName,
		Class: fmt.Sprintf("0x%06x", n.Class), Driver: n.Driver, NUMANode: n.NUMANode,
		Netdevs: orEmpty(n.Netdevs), LinkUp: linkUp, LinkType: n.LinkType,
		IBDevices: orEmpty(n.IBDevices), RDMADevices: orEmpty(n.RDMADevices), IOMMUGroup: n.IOMMUGroup,
		PF: n.PF, VFs: orEmpty(n.VFs), NumVFs: n.NumVFs, DefaultRoute: n.DefaultRoute,
		Failed: n.Failed, Problems: orEmpty(n.Problems),
		Pool: pool, Health: health, Reason: reason, AllocatedTo: listedHolders(holders),
	}
}

// orEmpty makes a nil list [] in JSON, not null.
func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// listNICs scans the NICs once and judges them as serve would, and passes
// each pool to the DRA preview. held says who holds a pooled NIC.
func listNICs(cfg config.Config, preview *[]draslice.Device, held func(pool, address string) []podresources.Holder, log, draLog *slog.Logger) ([]listedNIC, error) {
	scan, updates, err := scanPools(cfg, log)
	if err != nil {
		return nil, err
	}
	type member struct{ pool, health, reason string }
	members := map[string]member{}
	for _, u := range updates {
		devs := draslice.NICDevices(draslice.NICPool{Name: u.Pool.Resource(), NICs: u.Pool.NICs()}, cfg.SysfsRoot, noCDIName, draLog)
		reasons := map[string]string{}
		for _, d := range u.Devices {
			if !d.Healthy {
				reasons[d.ID] = d.Reason
			}
		}
		*preview = append(*preview, withTaints(devs, reasons)...)
		for _, d := range u.Devices {
			m := member{pool: u.Pool.Resource(), health: "Healthy"}
			if !d.Healthy {
				m.health, m.reason = "Unhealthy", d.Reason
			}
			members[d.ID] = m
		}
	}
	out := make([]listedNIC, 0, len(scan))
	for _, n := range scan {
		m := members[n.Address]
		var holders []podresources.Holder
		if m.pool != "" {
			holders = held(m.pool, n.Address)
		}
		out = append(out, newListedNIC(n, m.pool, m.health, m.reason, holders))
	}
	return out, nil
}

func list(c *cli.Context, open daemon.OpenFunc, stdout, stderr io.Writer) error {
	n, err := lookAtNode(c, open, stderr, checkOutput)
	if err != nil {
		return err
	}
	defer n.lib.Shutdown()
	cfg, log, lib, inv := n.cfg, n.log, n.lib, n.inv
	output, _ := outputFormat(c)
	node, err := cfg.Node()
	if err != nil {
		return err
	}
	served, err := layout.GPUs(daemon.LayoutOptions(cfg), inv, nil, log)
	if err != nil {
		return err
	}
	as := func(uuid string) layout.Served { sv, _ := served.Of(uuid); return sv }
	// What the DRA preview finds wanting (a PCIe root) is said in DRA's
	// words, which only DRA mode, or --dra, should hear above debug.
	showDRA := c.Bool("dra") || cfg.KubeletAPI == config.KubeletAPIDRA
	draLog := log
	if !showDRA {
		draLog = slog.New(debugOnly{log.Handler()})
	}
	dra, partitioned := listPartitions(cfg, lib, inv, log)
	st, err := pollHealth(cfg, lib, inv, served, partitioned, log)
	if err != nil {
		return err
	}
	holders := listHolders(c.Context, cfg, log)
	out := listing{DriverVersion: inv.DriverVersion, NVMLVersion: inv.NVMLVersion, GPUs: make([]listedGPU, 0, len(inv.GPUs)), NICs: []listedNIC{},
		CDIHook: newListedHook(cfg), RuntimeDoor: newListedDoor(cfg), Labels: map[string]string{},
		UnmatchedGPUEntries: append([]config.UnmatchedGPU{}, n.unmatched...)}
	maps.Copy(out.Labels, nodelabels.Of(daemon.LabelFacts(cfg), inv))
	// What DRA mode would publish: the same devices, with taints for
	// the unhealthy (without times: when a condition began is the
	// running plugin's to say). DRA publishes a MIG GPU's MIG devices,
	// so theirs are the reasons that count there.
	gpuCDIName := func(uuid string) string { return cdi.QualifiedName(cdi.GPUKind, uuid) }
	reasons := map[string]string{}
	for i, g := range inv.GPUs {
		healthy, reason := st.gpu(i)
		if partitioned[i] {
			// As the DRA front-end watches it: one part for every instance.
			healthy, reason = st.mig(g.UUID)
		}
		if !healthy {
			reasons[g.UUID] = reason
		}
		for _, m := range g.MIG {
			if healthy, reason := st.mig(m.UUID); !healthy {
				reasons[m.UUID] = reason
			}
		}
	}
	out.DRA = listedDRA{Driver: config.DRADriverName, Pool: node, Devices: withTaints(draslice.GPUDevices(dra, cfg.SysfsRoot, gpuCDIName, draLog), reasons)}
	// held merges a unit's holders through the device-plugin API (any of
	// its device IDs under the resource it is served as) and through DRA.
	held := func(uuid, draName string) []podresources.Holder {
		a := as(uuid)
		return holders.Of(podresources.Names{Resource: a.Resource, IDs: a.IDs, Driver: config.DRADriverName, Pool: node, DRADevice: draName})
	}
	for i, g := range inv.GPUs {
		healthy, reason := st.gpu(i)
		lg := newListedGPU(g, healthState(healthy), reason, as(g.UUID), held(g.UUID, draslice.GPUDeviceName(g)))
		for _, m := range g.MIG {
			healthy, reason := st.mig(m.UUID)
			lg.MIG = append(lg.MIG, newListedMIG(m, healthState(healthy), reason, as(m.UUID), held(m.UUID, draslice.MIGDeviceName(g, m))))
		}
		out.GPUs = append(out.GPUs, lg)
	}
	addMPS(cfg, out.GPUs, log)
	// Excluded GPUs are listed so that nobody wonders where they went;
	// nothing of theirs is served, checked or labelled.
	for _, g := range n.excluded {
		out.GPUs = append(out.GPUs, newListedGPU(g, healthExcluded, "excludeGPUs/includeGPUs", layout.Served{}, nil))
	}
	slices.SortStableFunc(out.GPUs, func(a, b listedGPU) int { return a.Index - b.Index })
	// NICs are the second half of the listing: a sysfs without PCI
	// devices (a container without /sys mounted) must not hide the GPUs.
	heldNIC := func(pool, address string) []podresources.Holder {
		return holders.Of(podresources.Names{Resource: pool, IDs: []string{address}, Driver: config.DRADriverName, Pool: node, DRADevice: draslice.NICDeviceName(address)})
	}
	if nics, err := listNICs(cfg, &out.DRA.Devices, heldNIC, log, draLog); err != nil {
		log.Warn("NICs not listed", "err", err)
	} else {
		out.NICs = nics
	}
	if output == "json" {
		return writeJSON(stdout, out)
	}
	return writeTable(stdout, out, showDRA)
}

func healthState(healthy bool) string {
	if healthy {
		return "Healthy"
	}
	return "Unhealthy"
}

// healthStates is one poll's health of the GPUs and their MIG devices.
type healthStates struct {
	// served watches as serve does: MIG devices the layout serves as
	// parts, every other GPU whole (so a MIG GPU served whole under
	// strategy none is Unhealthy, mig-enabled).
	served *health.Watcher
	// all has every MIG device as a part, as the DRA front-end watches
	// them; nil when served already does.
	all *health.Watcher
}

func (h healthStates) gpu(i int) (bool, string) { return h.served.State(i) }

func (h healthStates) mig(uuid string) (bool, string) {
	if healthy, reason, ok := h.served.PartState(uuid); ok || h.all == nil {
		return healthy, reason
	}
	healthy, reason, _ := h.all.PartState(uuid)
	return healthy, reason
}

// pollHealth polls once through the same policy serve uses; events need
// a watch over time, so list reports what the polled state says now.
func pollHealth(cfg config.Config, lib nvml.Library, inv *nvml.Inventory, served *layout.Node, partitioned []bool, log *slog.Logger) (healthStates, error) {
	ids := make([]string, len(inv.GPUs))
	for i, g := range inv.GPUs {
		ids[i] = g.UUID
	}
	parts := make([][]health.Part, len(inv.GPUs))
	all := make([][]health.Part, len(inv.GPUs))
	nServed, nAll := 0, 0
	for _, sv := range served.Units() {
		if u := sv.Unit; u.MIG != nil {
			parts[u.Pos] = append(parts[u.Pos], migPart(*u.MIG))
			nServed++
		}
	}
	for i, g := range inv.GPUs {
		for _, m := range g.MIG {
			all[i] = append(all[i], migPart(m))
			nAll++
		}
		if partitioned[i] {
			all[i] = append(all[i], health.Part{ID: g.UUID, GPUInstance: health.AnyInstance})
			nAll++
		}
	}
	poll := func(parts [][]health.Part, log *slog.Logger) (*health.Watcher, error) {
		w, err := health.NewWatcher(daemon.HealthPolicy(cfg), ids, nvml.NewMonitor(lib, inv, log), discard{}, nil, log, health.WithParts(parts))
		if err != nil {
			return nil, err
		}
		w.Poll()
		return w, nil
	}
	var h healthStates
	var err error
	if h.served, err = poll(parts, log); err != nil || nServed == nAll {
		return h, err
	}
	// The second poll reads the same GPUs: its warnings would repeat.
	h.all, err = poll(all, slog.New(slog.DiscardHandler))
	return h, err
}

// listPartitions is what DRA mode publishes of the GPUs, with the GPUs
// sharing.migPartitions selects as every placement they allow (whoever
// made the instances on them: list does not read the claims), and which
// GPUs (by position) are partitioned. A GPU whose placements cannot be
// read is said and published as without the setting.
func listPartitions(cfg config.Config, lib nvml.Library, inv *nvml.Inventory, log *slog.Logger) (draslice.GPUs, []bool) {
	in := draslice.GPUsOf(inv, daemon.MemoryShares(cfg))
	partitioned := make([]bool, len(inv.GPUs))
	if !cfg.Sharing.MIGPartitions.Enabled {
		return in, partitioned
	}
	p, err := nvml.NewPartitioner(lib, log)
	if err != nil {
		log.Warn("sharing.migPartitions is set, and no GPU is partitioned", "err", err)
		return in, partitioned
	}
	in.Partitions = draslice.Partitions(inv.GPUs, daemon.MIGPartitioned(cfg), p.Layout, log)
	for i, g := range inv.GPUs {
		_, partitioned[i] = in.Partitions[g.UUID]
	}
	return in, partitioned
}

func migPart(m nvml.MIGDevice) health.Part {
	return health.Part{ID: m.UUID, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance}
}

// addMPS asks the MPS control daemons of the GPUs shared through MPS, which
// the serving plugin runs, what they say of themselves; a healthy GPU
// whose daemon is down is shown Unhealthy, mps-daemon-down, as serve
// reports it. In DRA mode a GPU
// is shared through MPS while claims hold it: while its daemon's
// directory is there.
func addMPS(cfg config.Config, gpus []listedGPU, log *slog.Logger) {
	var uuids []string
	for i, g := range gpus {
		if cfg.KubeletAPI == config.KubeletAPIDRA {
			if _, err := os.Stat(gpu.MPSDir(cfg.MPSRoot, g.UUID, gpu.MPSPipe)); err == nil {
				gpus[i].Sharing = sharingMPS
			}
		}
		if gpus[i].Sharing == sharingMPS {
			uuids = append(uuids, g.UUID)
		}
	}
	if len(uuids) == 0 {
		return
	}
	st, err := daemon.MPSStatus(cfg, uuids, log)
	if err != nil {
		log.Warn("MPS control daemons not asked", "err", err)
		return
	}
	for i, g := range gpus {
		s, ok := st[g.UUID]
		if !ok {
			continue
		}
		l := &listedMPS{Daemon: "down", Servers: s.Servers, Clients: s.Clients}
		if s.Up {
			l.Daemon = "up"
		} else if gpus[i].Health == "Healthy" {
			// As serve has it: a GPU's shares are withheld while its
			// daemon is down.
			gpus[i].Health, gpus[i].Reason = "Unhealthy", mpsd.ReasonDown
		}
		if s.Err != nil {
			l.Error = s.Err.Error()
		}
		gpus[i].MPS = l
	}
}

// listHolders asks the kubelet who holds the devices. Holders are
// extra: without them (no kubelet here, or no access to its socket) the
// listing is complete but for them, with one note saying why.
func listHolders(ctx context.Context, cfg config.Config, log *slog.Logger) podresources.Holders {
	if cfg.PodResourcesSocket == "" {
		return podresources.Holders{} // asked not to read any (off the node, say)
	}
	h, err := podresources.Client{Socket: cfg.PodResourcesSocket}.Holders(ctx)
	switch {
	case errors.Is(err, podresources.ErrUnavailable):
		log.Warn("kubelet PodResources API unavailable; device holders not shown", "socket", cfg.PodResourcesSocket, "setting", "podResourcesSocket (--pod-resources-socket)", "err", err)
	case err != nil:
		log.Warn("reading the kubelet PodResources API failed; device holders not shown", "socket", cfg.PodResourcesSocket, "setting", "podResourcesSocket (--pod-resources-socket)", "err", err)
	}
	return h
}

func healthColumn(state, reason string) string {
	if reason != "" {
		return state + " (" + reason + ")"
	}
	return state
}

// replicasColumn is the table's REPLICAS: how many replicas a unit is
// served as, and how they are shared when through MPS, with its daemon's
// state ("4 mps: up, 2 clients"); - when it is not shared (or not served).
func replicasColumn(ids []string, sharing string, mps *listedMPS) string {
	if len(ids) < 2 {
		return "-"
	}
	n := strconv.Itoa(len(ids))
	switch {
	case sharing != sharingMPS:
		return n
	case mps == nil:
		return n + " mps"
	case mps.Daemon != "up":
		return n + " mps: daemon down"
	}
	return fmt.Sprintf("%s mps: up, %d clients", n, mps.Clients)
}

// holderColumn is the table's HOLDER: namespace/pod/container, several
// comma-separated, - when none.
func holderColumn(hs []listedHolder) string {
	names := make([]string, len(hs))
	for i, h := range hs {
		names[i] = h.Namespace + "/" + h.Pod + "/" + h.Container
	}
	return orDash(strings.Join(names, ","))
}

func writeJSON(w io.Writer, l listing) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // a reason reads "thermal=92C>=slowdown 90C", not "\u003e="
	return enc.Encode(l)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// noCDIName: NIC CDI names need the pool's scan state; list shows the
// attributes, and CDI IDs appear only in Prepare's answers.
func noCDIName(string, string) string { return "" }

// withTaints gives each device whose model ID has a reason its taints.
func withTaints(devs []draslice.Device, reasons map[string]string) []draslice.Device {
	for i, d := range devs {
		if r, ok := reasons[d.ID]; ok {
			devs[i].Taints = draslice.TaintsOf(config.DRADriverName, r)
		}
	}
	return devs
}

// debugOnly logs every record at debug level.
type debugOnly struct{ slog.Handler }

func (h debugOnly) Enabled(ctx context.Context, _ slog.Level) bool {
	return h.Handler.Enabled(ctx, slog.LevelDebug)
}

func (h debugOnly) Handle(ctx context.Context, r slog.Record) error {
	r.Level = slog.LevelDebug
	return h.Handler.Handle(ctx, r)
}

func (h debugOnly) WithAttrs(attrs []slog.Attr) slog.Handler {
	return debugOnly{h.Handler.WithAttrs(attrs)}
}

func (h debugOnly) WithGroup(name string) slog.Handler { return debugOnly{h.Handler.WithGroup(name)} }

// discard takes health transitions nobody serves.
type discard struct{}

func (discard) SetHealth(string, bool, string) bool { return false }

// writeTable prints the listing; the DRA devices only when showDRA (a
// device-plugin node's operator rarely wants them).
func writeTable(w io.Writer, l listing, showDRA bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tUUID\tNAME\tMEMORY\tPCI BUS ID\tNUMA\tHEALTH\tRESOURCE\tREPLICAS\tHOLDER")
	for _, g := range l.GPUs {
		numa := "-"
		if g.NUMANode >= 0 {
			numa = fmt.Sprint(g.NUMANode)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d MiB\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, g.UUID, g.Name, g.MemoryBytes>>20, g.PCIBusID, numa,
			healthColumn(g.Health, g.Reason), orDash(g.Resource), replicasColumn(g.DeviceIDs, g.Sharing, g.MPS), holderColumn(g.AllocatedTo))
		// MIG devices under their GPU, indented, by NVIDIA's index form.
		for _, m := range g.MIG {
			fmt.Fprintf(tw, "  %d:%d\t%s\t%s\t%d MiB\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, m.Index, m.UUID, m.Profile, m.MemoryBytes>>20, g.PCIBusID, numa,
				healthColumn(m.Health, m.Reason), orDash(m.Resource), replicasColumn(m.DeviceIDs, m.Sharing, nil), holderColumn(m.AllocatedTo))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(l.NICs) > 0 {
		fmt.Fprintln(tw, "\nNIC\tVENDOR:DEVICE\tDRIVER\tNETDEVS\tRDMA\tNUMA\tPOOL\tHEALTH\tHOLDER")
		for _, n := range l.NICs {
			numa, pool, health := "-", "-", "-"
			if n.NUMANode >= 0 {
				numa = fmt.Sprint(n.NUMANode)
			}
			if n.Pool != "" {
				pool, health = n.Pool, n.Health
				if n.Reason != "" {
					health += " (" + n.Reason + ")"
				}
			}
			fmt.Fprintf(tw, "%s\t%s:%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Address, n.Vendor, n.Device, orDash(n.Driver),
				orDash(strings.Join(n.Netdevs, ",")), orDash(strings.Join(n.RDMADevices, ",")), numa, pool, health, holderColumn(n.AllocatedTo))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if showDRA && len(l.DRA.Devices) > 0 {
		fmt.Fprintf(tw, "\nDRA DEVICE (%s, pool %s)\tTYPE\tID\tPCIE ROOT\tNUMA\tTAINTS\n", l.DRA.Driver, l.DRA.Pool)
		for _, d := range l.DRA.Devices {
			attr := func(name string) string {
				a := d.Attributes[name]
				switch {
				case a.String != nil:
					return *a.String
				case a.Int != nil:
					return fmt.Sprint(*a.Int)
				}
				return "-"
			}
			id := attr("uuid")
			if id == "-" {
				id = attr("resource.kubernetes.io/pciBusID")
			}
			var taints []string
			for _, t := range d.Taints {
				taints = append(taints, t.Key+"="+t.Value+":"+t.Effect)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, attr("type"), id, attr("resource.kubernetes.io/pcieRoot"),
				attr("resource.kubernetes.io/numaNode"), orDash(strings.Join(taints, ",")))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if h := l.CDIHook; h.InUse && h.Path != "" {
		if h.Installed {
			fmt.Fprintf(w, "CDI hook: %s\n", h.Path)
		} else {
			fmt.Fprintf(w, "CDI hook: NOT INSTALLED (%s): %s\n", h.Problem, cdi.HookMissingMessage(h.Path))
		}
	}
	switch d := l.RuntimeDoor; d.State {
	case string(runtimes.Open):
		fmt.Fprintf(w, "NVIDIA_VISIBLE_DEVICES: OPEN: any pod can see every GPU by setting it (%s; %s: %s); fix: %s\n", d.Runtime, d.ConfigPath, d.Key, d.Fix)
	case string(runtimes.Unknown):
		fmt.Fprintf(w, "NVIDIA_VISIBLE_DEVICES: UNKNOWN whether pods can see every GPU by setting it: %s\n", d.Error)
	case string(runtimes.Closed):
		fmt.Fprintf(w, "NVIDIA_VISIBLE_DEVICES: closed to pods that ask for no GPU (%s)\n", d.Reason)
	}
	for _, u := range l.UnmatchedGPUEntries {
		fmt.Fprintln(w, u.String())
	}
	if l.DriverVersion != "" {
		_, err := fmt.Fprintf(w, "driver %s, NVML %s\n", l.DriverVersion, l.NVMLVersion)
		return err
	}
	return nil
}
