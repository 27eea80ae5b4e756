package daemon

import (
	"strconv"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/layout"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// servedUnit is one whole GPU or MIG device as served: the resource and
// device IDs (one per time-slicing replica) the kubelet knows it by, and
// its name in this node's DRA pool.
type servedUnit struct {
	unit     gpu.Unit
	resource string
	ids      []string
	draName  string
}

// servedUnits are the units health is watched for: those fe lays out, or
// else DRA's (layout.DRAUnits), each under resname.GPU.
func servedUnits(fe FrontEnd, gpus []nvml.GPU) []servedUnit {
	if l, ok := fe.(laidOut); ok {
		return laidOutUnits(l.Served())
	}
	var out []servedUnit
	for _, u := range layout.DRAUnits(gpus) {
		out = append(out, servedUnit{unit: u, resource: resname.GPU, draName: draName(u)})
	}
	return out
}

// laidOutUnits are the units layout.GPUs lays out.
func laidOutUnits(served []layout.Served) []servedUnit {
	var out []servedUnit
	for _, sv := range served {
		out = append(out, servedUnit{unit: sv.Unit, resource: sv.Resource, ids: sv.IDs, draName: draName(sv.Unit)})
	}
	return out
}

// draName is the unit's device name in this node's DRA pool.
func draName(u gpu.Unit) string {
	if u.MIG != nil {
		return draslice.MIGDeviceName(u.GPU, *u.MIG)
	}
	return draslice.GPUDeviceName(u.GPU)
}

// healthParts are the MIG devices health is reported for, by GPU position.
func healthParts(units []servedUnit, n int) [][]health.Part {
	out := make([][]health.Part, n)
	for _, u := range units {
		if m := u.unit.MIG; m != nil && u.unit.Pos < n {
			out[u.unit.Pos] = append(out[u.unit.Pos], health.Part{ID: m.UUID, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance})
		}
	}
	return out
}

// recorder describes every unit to m and returns the recorder the health
// watcher reports through: each unit under the resource it is served as.
func recorder(units []servedUnit, m *metrics.Metrics) health.Recorder {
	rec := recorderMux{}
	for _, u := range units {
		g := u.unit.GPU
		info := metrics.DeviceInfo{
			UUID: u.unit.UUID(), Index: strconv.Itoa(g.Index), Model: g.Name, PCIBusID: g.PCIBusID, NUMANode: g.NUMANode,
			DRAName: u.draName,
		}
		if mig := u.unit.MIG; mig != nil {
			info.Index += ":" + strconv.Itoa(mig.Index)
			info.Model += " MIG " + mig.Profile
		}
		switch {
		case u.unit.MPS:
			info.Sharing, info.Replicas = metrics.SharingMPS, u.unit.Replicas
		case u.unit.Replicas > 1:
			info.Sharing, info.Replicas = metrics.SharingTimeSlicing, u.unit.Replicas
		}
		m.SetInfo(u.resource, info.UUID, info)
		rec[info.UUID] = m.For(u.resource)
	}
	return rec
}

// recorderMux passes each device's health to its resource's recorder.
type recorderMux map[string]health.Recorder

func (r recorderMux) Health(id string, healthy bool, reason string) {
	if rec, ok := r[id]; ok {
		rec.Health(id, healthy, reason)
	}
}

func (r recorderMux) Transition(id string, healthy bool, reason string) {
	if rec, ok := r[id]; ok {
		rec.Transition(id, healthy, reason)
	}
}
