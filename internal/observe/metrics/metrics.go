// Package metrics exports device health, device facts and who holds each
// device to Prometheus: gpu_device_plugin_device_healthy,
// _health_transitions_total and _device_info from what the health watchers
// record, and _device_allocated read from the kubelet (package
// podresources) at scrape time; the plugin's own API requests,
// gpu_device_plugin_api_requests_total, as package kubeapi tells them; and
// whether NVIDIA_VISIBLE_DEVICES opens every GPU to any pod,
// gpu_device_plugin_runtime_envvar_door_open, as package runtimes reads it;
// and the Go runtime's and this process's go_* and process_* series.
// Package exposition writes them out; no Prometheus client library is
// linked.
package metrics

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics/exposition"
)

// Metrics exposes device health and device facts to Prometheus, for every
// resource. Health and facts are kept per device and written out at each
// scrape, so a device whose reason changes has exactly one
// gpu_device_plugin_device_healthy series, never one per reason it had.
type Metrics struct {
	transitions *exposition.Counter
	requests    *exposition.Counter
	remediation *Remediation
	state       stateFamilies

	mu      sync.Mutex
	devices map[deviceKey]*deviceMetrics
	mps     func() map[string]bool // nil: no GPU shared through MPS
	door    *door                  // nil: the runtime configs were not read
}

// door is what gpu_device_plugin_runtime_envvar_door_open says.
type door struct {
	open            bool
	runtime, reason string
}

// SetRuntimeDoor sets gpu_device_plugin_runtime_envvar_door_open: open
// when any pod can see every GPU by setting NVIDIA_VISIBLE_DEVICES,
// runtime the one running NVIDIA's runtime ("" when none), reason why.
func (m *Metrics) SetRuntimeDoor(open bool, runtime, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.door = &door{open, runtime, reason}
}

// SetMPSDaemons sets where gpu_device_plugin_mps_daemon_up is read at
// each scrape: up, by GPU UUID.
func (m *Metrics) SetMPSDaemons(up func() map[string]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mps = up
}

type deviceKey struct{ resource, device string }

type deviceMetrics struct {
	health  bool // Health was recorded
	healthy bool
	reason  string
	info    *DeviceInfo
}

// DeviceInfo is what gpu_device_plugin_device_info says about a device,
// and the name DRA knows it by, to find its holders.
type DeviceInfo struct {
	// UUID and Index are a GPU's; empty for NICs.
	UUID  string
	Index string
	// Model is a GPU's product name, a NIC's PCI vendor:device IDs
	// (15b3:1021): those read the same on every machine, unlike pci.ids
	// names.
	Model    string
	PCIBusID string
	// NUMANode is negative when unknown: the label is then empty.
	NUMANode int
	// DRAName is the device's name in this node's ResourceSlice pool
	// (gpu-0, nic-0000-3b-00-0).
	DRAName string
	// Sharing is how a GPU is shared (SharingMPS, SharingTimeSlicing),
	// empty when it is not; Replicas how many ways.
	Sharing  string
	Replicas int
}

// Values of gpu_device_plugin_device_sharing's mode.
const (
	SharingTimeSlicing = "time-slicing"
	SharingMPS         = "mps"
)

// stateFamilies are the families written from the kept health and facts.
type stateFamilies struct{ healthy, info, sharing, mps, door *exposition.Desc }

func newStateFamilies() stateFamilies {
	return stateFamilies{
		healthy: &exposition.Desc{Name: "gpu_device_plugin_device_healthy",
			Help:   "1 when the device is healthy, 0 when it is not; reason says why not (empty when healthy).",
			Type:   exposition.TypeGauge,
			Labels: []string{"resource", "device", "reason"}},
		info: &exposition.Desc{Name: "gpu_device_plugin_device_info",
			Help:   "1 for every device served: its UUID, index and model (a GPU's product name, a NIC's vendor:device), PCI bus ID and NUMA node.",
			Type:   exposition.TypeGauge,
			Labels: []string{"resource", "device", "uuid", "index", "model", "pci_bus_id", "numa_node"}},
		sharing: &exposition.Desc{Name: "gpu_device_plugin_device_sharing",
			Help:   "1 for every shared device: how it is shared (mode: time-slicing or mps) and how many replicas it is served as.",
			Type:   exposition.TypeGauge,
			Labels: []string{"resource", "device", "mode", "replicas"}},
		mps: &exposition.Desc{Name: "gpu_device_plugin_mps_daemon_up",
			Help:   "1 while the MPS control daemon of a GPU shared through MPS answers, 0 while it is down (its shares are then withheld).",
			Type:   exposition.TypeGauge,
			Labels: []string{"device"}},
		door: &exposition.Desc{Name: "gpu_device_plugin_runtime_envvar_door_open",
			Help:   "1 when any pod, even one that asks for no GPU, can see every GPU by setting NVIDIA_VISIBLE_DEVICES, as the node's container runtime configs say at start; 0 when not, or when unknown (reason unreadableConfig).",
			Type:   exposition.TypeGauge,
			Labels: []string{"runtime", "reason"}},
	}
}

// NewMetrics registers the health metrics with reg.
func NewMetrics(reg *exposition.Registry) (*Metrics, error) {
	m := &Metrics{
		transitions: exposition.NewCounter(exposition.Desc{Name: "gpu_device_plugin_health_transitions_total",
			Help:   "Health transitions per device, by the state entered and the reason (empty when Healthy).",
			Labels: []string{"resource", "device", "to", "reason"}}),
		requests: exposition.NewCounter(exposition.Desc{Name: "gpu_device_plugin_api_requests_total",
			Help:   "Requests to the Kubernetes API server by Events, the Node condition and Node labels, by API verb, resource and HTTP status code (error: no answer). DRA's ResourceClaim and ResourceSlice requests are not counted here.",
			Labels: []string{"verb", "resource", "code"}}),
		state:   newStateFamilies(),
		devices: map[deviceKey]*deviceMetrics{},
	}
	for _, c := range []exposition.Collector{m.transitions, m.requests, stateCollector{m}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the health metrics: %w", err)
		}
	}
	var err error
	if m.remediation, err = NewRemediation(reg); err != nil {
		return nil, err
	}
	return m, nil
}

// Remediation is the recorder of the GPUs' remediation.
func (m *Metrics) Remediation() *Remediation { return m.remediation }

// ObserveRequest counts one API request (kubeapi.RequestObserver).
func (m *Metrics) ObserveRequest(verb, resource, code string) {
	m.requests.Inc(verb, resource, code)
}

// For returns the recorder of resource's devices (a health.Recorder).
func (m *Metrics) For(resource string) Resource {
	return Resource{m: m, resource: resource}
}

// SetInfo sets device's facts, replacing any set before.
func (m *Metrics) SetInfo(resource, device string, info DeviceInfo) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.device(resource, device).info = &info
}

// device returns the entry of a device, made on first use; m.mu is held.
func (m *Metrics) device(resource, device string) *deviceMetrics {
	k := deviceKey{resource, device}
	d := m.devices[k]
	if d == nil {
		d = &deviceMetrics{}
		m.devices[k] = d
	}
	return d
}

// served is a device the allocation metric looks up: one with facts.
type served struct {
	resource, device string
	info             DeviceInfo
}

// served lists the devices with facts.
func (m *Metrics) served() []served {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]served, 0, len(m.devices))
	for k, d := range m.devices {
		if d.info != nil {
			out = append(out, served{resource: k.resource, device: k.device, info: *d.info})
		}
	}
	return out
}

// stateCollector writes out the kept health and facts at each scrape.
type stateCollector struct{ m *Metrics }

func (c stateCollector) Describe() []*exposition.Desc {
	f := c.m.state
	return []*exposition.Desc{f.healthy, f.info, f.sharing, f.mps, f.door}
}

func (c stateCollector) Collect(s *exposition.Scrape) {
	f := c.m.state
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	for k, d := range c.m.devices {
		if d.health {
			s.Add(f.healthy, one(d.healthy), k.resource, k.device, d.reason)
		}
		if i := d.info; i != nil {
			numa := ""
			if i.NUMANode >= 0 {
				numa = strconv.Itoa(i.NUMANode)
			}
			s.Add(f.info, 1, k.resource, k.device, i.UUID, i.Index, i.Model, i.PCIBusID, numa)
			if i.Sharing != "" {
				s.Add(f.sharing, 1, k.resource, k.device, i.Sharing, strconv.Itoa(i.Replicas))
			}
		}
	}
	if d := c.m.door; d != nil {
		s.Add(f.door, one(d.open), d.runtime, d.reason)
	}
	if c.m.mps != nil {
		for uuid, up := range c.m.mps() {
			s.Add(f.mps, one(up), uuid)
		}
	}
}

// one is a boolean gauge's value.
func one(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Resource records one resource's device health and transitions.
type Resource struct {
	m        *Metrics
	resource string
}

// Health records a device's state now.
func (r Resource) Health(device string, healthy bool, reason string) {
	if healthy {
		reason = ""
	}
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	d := r.m.device(r.resource, device)
	d.health, d.healthy, d.reason = true, healthy, reason
}

// Transition counts a change of state.
func (r Resource) Transition(device string, healthy bool, reason string) {
	to := "Unhealthy"
	if healthy {
		to, reason = "Healthy", ""
	}
	r.m.transitions.Inc(r.resource, device, to, reason)
}
