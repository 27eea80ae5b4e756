package nic

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/allocator"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

// ErrUnknownNIC marks an allocation naming a NIC that is not in the pool.
var ErrUnknownNIC = errors.New("unknown NIC")

// Options shape the pools' allocation answers.
type Options struct {
	// DevRoot is the host's /dev as both this process and the container
	// runtime see it; default "/dev".
	DevRoot string
	// Strategies are the device-list strategies (envvar, cdi-cri,
	// cdi-annotations); empty means envvar.
	Strategies []string
	Log        *slog.Logger
	// Now is the clock that times how long a removed NIC has been gone;
	// default time.Now.
	Now func() time.Time
}

// Pools are every configured NIC pool. They decide which pool owns each
// NIC: the first, in config order, that selects it when it first appears.
// Ownership then sticks for the life of the process, so a NIC whose netdev
// a pod moved away (and which a netdevs, linkTypes or rdma selector no
// longer matches) stays in its pool, and a NIC never moves to another
// pool while a pod may hold it.
type Pools struct {
	log *slog.Logger
	now func() time.Time

	// mu serialises Rescan; the pools' own state is read lock-free.
	mu    sync.Mutex
	pools []*Pool
	owner map[string]*Pool
	// gone is when each member was first missing from a scan.
	gone map[string]time.Time
	// routeRefused is the reason last logged for refusing NICs while the
	// default route is unknown; empty while it is known.
	routeRefused string
}

// Pool is one NIC resource. Its Allocate and Preferred are what a
// front-end (the device plugin's Backend and PreferredAllocator, say)
// needs to serve it.
type Pool struct {
	resource string
	env      string
	sel      config.NICSelectors
	devRoot  string
	// linkCheck is a LinkCheck* value; empty picks per NIC.
	linkCheck string
	// grace is how long a member may be gone before it leaves.
	grace time.Duration

	// How Allocate names devices: device nodes (envvar) and CDI names.
	nodes, cdiCRI, cdiAnnotations bool

	state atomic.Pointer[poolState]
}

// poolState is an immutable view of a pool after one rescan.
type poolState struct {
	members []string             // PCI addresses, sorted
	nics    map[string]sysfs.NIC // latest facts; a removed NIC keeps its last
	present map[string]bool      // in the latest scan
	devices []device.Device
	graph   *allocator.Graph
}

// Update is one pool's device list after a rescan.
type Update struct {
	Pool    *Pool
	Devices []device.Device
	// Changed is false when Devices equal the previous list, so the
	// caller can skip waking the kubelet's ListAndWatch streams.
	Changed bool
}

// NewPools builds empty pools, one per configured resource, in config
// order. The resources must have passed config validation; NewPools only
// refuses what would collide at run time.
func NewPools(res []config.NICResource, o Options) (*Pools, error) {
	if o.DevRoot == "" {
		o.DevRoot = "/dev"
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	ps := &Pools{log: o.Log, now: o.Now, owner: map[string]*Pool{}, gone: map[string]time.Time{}}
	envs := map[string]string{}
	usesCDI := slices.Contains(o.Strategies, "cdi-cri") || slices.Contains(o.Strategies, "cdi-annotations")
	for i, r := range res {
		if r.Name == "" || r.Selectors.IsEmpty() {
			return nil, fmt.Errorf("nicResources[%d]: a pool needs a name and at least one selector", i)
		}
		if usesCDI {
			// Config validation says this first; a name that is no CDI
			// kind would only fail (or panic the CDI library) later.
			if err := config.CheckCDIKind(r.Name); err != nil {
				return nil, fmt.Errorf("nicResources[%d].name: %q is not a CDI kind: %w; rename the pool (example: \"example.com/rdma_numa0\")", i, r.Name, err)
			}
		}
		env := EnvName(r.Name)
		if prev, dup := envs[env]; dup {
			return nil, fmt.Errorf("nicResources[%d]: %s and %s both give the environment variable %s; rename one", i, prev, r.Name, env)
		}
		envs[env] = r.Name
		p := &Pool{resource: r.Name, env: env, sel: r.Selectors, devRoot: o.DevRoot, linkCheck: r.LinkCheck, grace: r.GracePeriod()}
		if len(o.Strategies) == 0 {
			p.nodes = true
		}
		for _, st := range o.Strategies {
			switch st {
			case "envvar":
				p.nodes = true
			case "cdi-cri":
				p.cdiCRI = true
			case "cdi-annotations":
				p.cdiAnnotations = true
			default:
				return nil, fmt.Errorf("device-list strategy %q: want envvar, cdi-cri or cdi-annotations", st)
			}
		}
		p.state.Store(&poolState{nics: map[string]sysfs.NIC{}, graph: allocator.NewGraph(nil, nil, nil)})
		ps.pools = append(ps.pools, p)
	}
	return ps, nil
}

// All returns the pools in config order.
func (ps *Pools) All() []*Pool { return slices.Clone(ps.pools) }

// Rescan folds a fresh scan into every pool: NICs seen for the first time
// join the first pool that selects them, every member's health is judged
// again, and a member missing from the scan stays listed as unhealthy
// (the kubelet keeps its allocation; it comes back healthy if the NIC
// returns at the same address) until it has been gone for its pool's
// removal grace period, when it leaves the pool. While the scan cannot
// tell which NIC carries the default route, a NIC joins only a pool that
// names it (pciAddresses or netdevs), or one bound to vfio-pci, which
// carries no host traffic. It returns one Update per pool, in config
// order. Call it at start and then at an interval; it is safe to call
// from any goroutine.
func (ps *Pools) Rescan(scan []sysfs.NIC) []Update {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	now := ps.now()
	byAddr := make(map[string]sysfs.NIC, len(scan))
	var refused []string
	unknownRoute := ""
	for _, n := range scan {
		byAddr[n.Address] = n
		if n.DefaultRouteUnknown != "" {
			unknownRoute = n.DefaultRouteUnknown
		}
		if _, owned := ps.owner[n.Address]; owned {
			continue
		}
		for _, p := range ps.pools {
			if !Selects(p.sel, n) {
				continue
			}
			if n.DefaultRouteUnknown != "" && n.Driver != sysfs.DriverVFIO && !namesNIC(p.sel, n) {
				// It may be the management NIC; it waits, unowned, so it
				// joins this same pool once the route is known.
				refused = append(refused, p.resource+"="+n.Address)
				break
			}
			ps.owner[n.Address] = p
			ps.log.Info("NIC joined pool", "resource", p.resource, "device", n.Address,
				"vendor", n.Vendor, "product", n.Device, "driver", n.Driver, "numa", n.NUMANode, "netdevs", n.Netdevs)
			break
		}
	}
	ps.logRefused(unknownRoute, refused)
	for addr, p := range ps.owner {
		if _, present := byAddr[addr]; present {
			delete(ps.gone, addr)
			continue
		}
		since, ok := ps.gone[addr]
		if !ok {
			ps.gone[addr], since = now, now
		}
		if gone := now.Sub(since); gone >= p.grace {
			delete(ps.owner, addr)
			delete(ps.gone, addr)
			ps.log.Warn("NIC left its pool: gone from sysfs for longer than the removal grace period", "resource", p.resource, "device", addr,
				"gone", gone.String(), "removalGracePeriod", p.grace.String())
		}
	}
	updates := make([]Update, len(ps.pools))
	for i, p := range ps.pools {
		var members []string
		for addr, owner := range ps.owner {
			if owner == p {
				members = append(members, addr)
			}
		}
		slices.Sort(members)
		updates[i] = p.update(members, byAddr, ps.log)
	}
	return updates
}

// logRefused says once, as one error, why NICs are kept out of pools while
// the default route is unknown, and how to fix it; and once when that ends.
func (ps *Pools) logRefused(reason string, refused []string) {
	switch {
	case reason == "" && ps.routeRefused != "":
		ps.log.Info("the NIC carrying the default route is known again; NICs held back join their pools")
		ps.routeRefused = ""
	case reason != "" && len(refused) > 0 && ps.routeRefused != reason:
		ps.log.Error("cannot tell which NIC is the node's management NIC (the one carrying the default route), so pools that do not name their NICs with pciAddresses or netdevs take none of them, lest they hand it to a pod; "+
			"fix: run the plugin with hostNetwork: true, or set --proc-root (procRoot) to the host's /proc as the plugin sees it (e.g. /host/proc/1 with hostPID: true)",
			"reason", reason, "refused", refused)
		ps.routeRefused = reason
	}
}

// update installs the pool's next state and logs every health change.
func (p *Pool) update(members []string, byAddr map[string]sysfs.NIC, log *slog.Logger) Update {
	prev := p.state.Load()
	next := &poolState{
		members: members,
		nics:    make(map[string]sysfs.NIC, len(members)),
		present: make(map[string]bool, len(members)),
		devices: make([]device.Device, len(members)),
	}
	ids := make([]string, len(members))
	numa := make([]int, len(members))
	for k, addr := range members {
		n, present := byAddr[addr]
		if !present {
			n = prev.nics[addr]
		}
		next.nics[addr] = n
		next.present[addr] = present
		h := p.check(n, present)
		node := n.NUMANode
		if node < 0 {
			node = device.NoNUMANode
		}
		next.devices[k] = device.Device{ID: addr, NUMANode: node, Healthy: h.Healthy, Reason: h.Reason}
		ids[k], numa[k] = addr, n.NUMANode

		before, known := prev.device(addr)
		if known && (before.Healthy != h.Healthy || before.Reason != h.Reason) {
			log.Warn("NIC health changed", "resource", p.resource, "device", addr,
				"from", healthWord(before.Healthy), "to", healthWord(h.Healthy), "reason", h.Reason)
		} else if !known && !h.Healthy {
			log.Warn("NIC joined unhealthy", "resource", p.resource, "device", addr, "reason", h.Reason)
		}
	}
	next.graph = allocator.NewGraph(ids, numa, func(i, j int) int {
		if numa[i] >= 0 && numa[i] == numa[j] {
			return 1
		}
		return 0
	})
	p.state.Store(next)
	return Update{Pool: p, Devices: slices.Clone(next.devices), Changed: !slices.Equal(prev.devices, next.devices)}
}

// check is Check plus what only the pool knows: its selectors and the
// default-route rule.
func (p *Pool) check(n sysfs.NIC, present bool) Health {
	if h := CheckLink(n, present, p.linkCheck); !h.Healthy || !present {
		return h
	}
	if why := mismatch(p.sel, n, true); why != "" {
		return Health{Reason: "no longer matches the pool's selectors: " + why}
	}
	if n.DefaultRoute && !namesAddress(p.sel, n.Address) {
		// It took over the default route after it joined.
		return Health{Reason: "carries the node's default route"}
	}
	if HasVFs(n) && !namesAddress(p.sel, n.Address) && len(p.sel.Netdevs) == 0 {
		// VFs were enabled after it joined: pods holding them share it.
		return Health{Reason: fmt.Sprintf("SR-IOV PF with %d VFs enabled; name it in pciAddresses to pool it anyway", max(n.NumVFs, len(n.VFs)))}
	}
	return Health{Healthy: true}
}

func healthWord(ok bool) string {
	if ok {
		return "healthy"
	}
	return "unhealthy"
}

func (s *poolState) device(id string) (device.Device, bool) {
	i, ok := slices.BinarySearch(s.members, id)
	if !ok {
		return device.Device{}, false
	}
	return s.devices[i], true
}

// Resource is the pool's extended-resource name.
func (p *Pool) Resource() string { return p.resource }

// EnvName is the environment variable Allocate sets.
func (p *Pool) EnvName() string { return p.env }

// Devices returns the pool's current device list: one per NIC, the PCI
// address as ID, sorted.
func (p *Pool) Devices() []device.Device {
	return slices.Clone(p.state.Load().devices)
}

// NICs returns the latest facts of the pool's NICs, sorted by address.
func (p *Pool) NICs() []sysfs.NIC {
	st := p.state.Load()
	out := make([]sysfs.NIC, len(st.members))
	for i, a := range st.members {
		out[i] = st.nics[a]
	}
	return out
}

// Allocate answers for one container: the PCI addresses, sorted, in
// EnvName(); each RDMA NIC's /dev/infiniband/uverbsN and, once,
// rdma_cm when the host has it; for NICs bound to vfio-pci, /dev/vfio/vfio
// and each one's IOMMU group node. The answer is in no kubelet API's
// terms; the front-end serving the pool translates it.
func (p *Pool) Allocate(ids []string) (*device.Answer, error) {
	st := p.state.Load()
	addrs := slices.Clone(ids)
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	perNIC, shared, err := p.deviceNodes(st, addrs)
	if err != nil {
		return nil, err
	}
	// The address list is useful to the workload whatever the strategy.
	resp := &device.Answer{Env: map[string]string{p.env: strings.Join(addrs, ",")}}
	if p.nodes {
		seen := map[string]bool{}
		for _, n := range append(slices.Concat(perNIC...), shared...) {
			if !seen[n.Path] {
				seen[n.Path] = true
				resp.Nodes = append(resp.Nodes, device.Node{ContainerPath: n.Path, HostPath: n.HostPath, Permissions: n.Permissions})
			}
		}
	}
	// A NIC without device nodes has nothing for a runtime to inject, so
	// it has no CDI device either (see CDISpec).
	var names []string
	for i, a := range addrs {
		if len(perNIC[i]) > 0 {
			names = append(names, cdi.QualifiedName(p.resource, a))
		}
	}
	if len(names) > 0 {
		if p.cdiCRI {
			resp.CDIDevices = names
		}
		if p.cdiAnnotations {
			ann, err := cdi.Annotations(cdi.DefaultOwner, strings.ReplaceAll(p.resource, "/", "_"), names)
			if err != nil {
				return nil, fmt.Errorf("building CDI annotations for %s: %w", p.resource, err)
			}
			resp.Annotations = ann
		}
	}
	return resp, nil
}

// deviceNodes lists the character devices each NIC needs, and the ones
// every NIC of a kind shares (rdma_cm, the vfio container).
func (p *Pool) deviceNodes(st *poolState, addrs []string) (perNIC [][]cdi.DeviceNode, shared []cdi.DeviceNode, err error) {
	node := func(containerPath, hostPath string) cdi.DeviceNode {
		return cdi.DeviceNode{Path: containerPath, HostPath: hostPath, Permissions: "rw"}
	}
	rdma, vfio := false, false
	for _, a := range addrs {
		n, ok := st.nics[a]
		if !ok {
			return nil, nil, fmt.Errorf("%w %q in %s", ErrUnknownNIC, a, p.resource)
		}
		var own []cdi.DeviceNode
		for _, uv := range n.RDMADevices {
			rdma = true
			own = append(own, node("/dev/infiniband/"+uv, filepath.Join(p.devRoot, "infiniband", uv)))
		}
		if n.Driver == sysfs.DriverVFIO {
			if n.IOMMUGroup == "" {
				return nil, nil, fmt.Errorf("NIC %s is bound to vfio-pci but has no IOMMU group", a)
			}
			vfio = true
			group := n.IOMMUGroup
			if !exists(filepath.Join(p.devRoot, "vfio", group)) && exists(filepath.Join(p.devRoot, "vfio", "noiommu-"+group)) {
				// vfio's no-IOMMU mode names the group node differently.
				group = "noiommu-" + group
			}
			own = append(own, node("/dev/vfio/"+group, filepath.Join(p.devRoot, "vfio", group)))
		}
		perNIC = append(perNIC, own)
	}
	if rdma && exists(filepath.Join(p.devRoot, "infiniband", "rdma_cm")) {
		shared = append(shared, node("/dev/infiniband/rdma_cm", filepath.Join(p.devRoot, "infiniband", "rdma_cm")))
	}
	if vfio {
		shared = append(shared, node("/dev/vfio/vfio", filepath.Join(p.devRoot, "vfio", "vfio")))
	}
	return perNIC, shared, nil
}

// CDISpec describes the pool's present NICs for container runtimes: one
// CDI device per NIC that has device nodes (RDMA or vfio), named by PCI
// address. It returns nil when no NIC has any.
func (p *Pool) CDISpec() (*specs.Spec, error) {
	st := p.state.Load()
	var addrs []string
	for _, a := range st.members {
		// A removed NIC stays listed, unhealthy, but its nodes are gone.
		if st.present[a] {
			addrs = append(addrs, a)
		}
	}
	perNIC, shared, err := p.deviceNodes(st, addrs)
	if err != nil {
		return nil, err
	}
	var devs []cdi.Device
	for i, a := range addrs {
		if len(perNIC[i]) > 0 {
			devs = append(devs, cdi.Device{Name: a, Edits: cdi.Edits{Nodes: perNIC[i]}})
		}
	}
	if len(devs) == 0 {
		return nil, nil
	}
	return cdi.Spec(p.resource, devs, cdi.Edits{Nodes: shared})
}

// CDIName is the CDI device ID of the NIC at address in the pool's spec,
// or "" when it has no device node of its own (a netdev-only NIC) or is
// not in the pool.
func (p *Pool) CDIName(address string) string {
	st := p.state.Load()
	n, ok := st.nics[address]
	if !ok || len(n.RDMADevices) == 0 && n.Driver != sysfs.DriverVFIO {
		return ""
	}
	return cdi.QualifiedName(p.resource, address)
}

// Preferred picks size NICs from available with mustInclude among them,
// packing them onto one NUMA node when one has room.
func (p *Pool) Preferred(available, mustInclude []string, size int) ([]string, error) {
	return p.state.Load().graph.Preferred(available, mustInclude, size)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
