package dra

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

// apiDevice is d as the API has it, with taints.
func apiDevice(d draslice.Device, taints []draslice.Taint) resourceapi.Device {
	out := resourceapi.Device{Name: d.Name, Attributes: apiAttributes(d.Attributes)}
	if d.AllowMultipleAllocations {
		out.AllowMultipleAllocations = &d.AllowMultipleAllocations
	}
	if len(d.Capacity) > 0 {
		out.Capacity = make(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, len(d.Capacity))
		for k, c := range d.Capacity {
			// draslice writes valid quantities; a bad one would be dropped
			// by the API server anyway.
			q, err := resource.ParseQuantity(c.Value)
			if err != nil {
				continue
			}
			dc := resourceapi.DeviceCapacity{Value: q}
			if p := c.RequestPolicy; p != nil {
				def, derr := resource.ParseQuantity(p.Default)
				lo, lerr := resource.ParseQuantity(p.Min)
				if derr == nil && lerr == nil {
					dc.RequestPolicy = &resourceapi.CapacityRequestPolicy{Default: &def, ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &lo}}
				}
			}
			out.Capacity[resourceapi.QualifiedName(k)] = dc
		}
	}
	for _, c := range d.ConsumesCounters {
		out.ConsumesCounters = append(out.ConsumesCounters, resourceapi.DeviceCounterConsumption{CounterSet: c.CounterSet, Counters: apiCounters(c.Counters)})
	}
	for _, t := range taints {
		dt := resourceapi.DeviceTaint{Key: t.Key, Value: t.Value, Effect: resourceapi.DeviceTaintEffect(t.Effect)}
		if t.TimeAdded != nil {
			dt.TimeAdded = &metav1.Time{Time: *t.TimeAdded}
		}
		out.Taints = append(out.Taints, dt)
	}
	return out
}

// apiAttributes are attrs as the API has them: a slice's device, a
// container's device metadata.
func apiAttributes(attrs map[string]draslice.Attribute) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	out := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(attrs))
	for k, a := range attrs {
		out[resourceapi.QualifiedName(k)] = resourceapi.DeviceAttribute{IntValue: a.Int, BoolValue: a.Bool, StringValue: a.String, VersionValue: a.Version}
	}
	return out
}

// apiCounterSets are the counter sets as the API has them.
func apiCounterSets(sets []draslice.CounterSet) []resourceapi.CounterSet {
	out := make([]resourceapi.CounterSet, len(sets))
	for i, c := range sets {
		out[i] = resourceapi.CounterSet{Name: c.Name, Counters: apiCounters(c.Counters)}
	}
	return out
}

func apiCounters(in map[string]int64) map[string]resourceapi.Counter {
	out := make(map[string]resourceapi.Counter, len(in))
	for k, v := range in {
		out[k] = resourceapi.Counter{Value: *resource.NewQuantity(v, resource.DecimalSI)}
	}
	return out
}
