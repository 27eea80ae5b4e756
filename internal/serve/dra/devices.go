package dra

import (
	"context"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

// SetGPUs replaces the node's GPUs and publishes at once; none when NVML
// is not there (yet). Their health starts as what SetHealth said last for
// the same UUID, else healthy.
func (d *Driver) SetGPUs(ctx context.Context, in draslice.GPUs) {
	d.mu.Lock()
	d.parents = map[string]nvml.GPU{}
	if len(in.Partitions) > 0 {
		parts := make(map[string]draslice.Partition, len(in.Partitions))
		for _, g := range in.GPUs {
			part, ok := in.Partitions[g.UUID]
			if !ok || !g.MIGEnabled {
				continue
			}
			part.Foreign = d.foreignLocked(g.UUID, part.Layout.Instances)
			for _, gi := range part.Foreign {
				d.o.Log.Warn("MIG: a GPU instance on a partitioned GPU was not made for a claim; it is not served, and no placement over its slices is published",
					"device", g.UUID, "gpuInstance", gi.ID, "profileID", gi.ProfileID, "start", gi.Start, "size", gi.Size)
			}
			parts[g.UUID] = part
			d.parents[g.UUID] = g
		}
		in.Partitions = parts
	}
	d.gpus = draslice.GPUDevices(in, d.o.SysfsRoot, d.o.GPUCDIID, d.o.Log)
	if d.cd != nil {
		clique := ""
		if ch, ok := draslice.ChannelDevice(in.GPUs); ok {
			d.gpus = append(d.gpus, ch)
			clique = *ch.Attributes["cliqueID"].String
		}
		d.cd.setClique(clique)
	}
	d.counters = draslice.CounterSets(in)
	d.reindex()
	d.reported["gpus"] = true
	d.mu.Unlock()
	d.publish(ctx)
}

// SetNICPool replaces one pool's NICs and their health (devs, by PCI
// address) and publishes: at once for the scan at start (first), when a
// pool reports like a source, debounced like a health change after.
func (d *Driver) SetNICPool(ctx context.Context, p draslice.NICPool, devs []device.Device, first bool) {
	es := draslice.NICDevices(p, d.o.SysfsRoot, d.o.NICCDIID, d.o.Log)
	d.mu.Lock()
	d.nics[p.Name] = es
	d.reindex()
	if first {
		d.reported["nic:"+p.Name] = true
	}
	for _, dv := range devs {
		d.setHealthLocked(dv.ID, dv.Healthy, dv.Reason)
	}
	d.mu.Unlock()
	if first {
		d.publish(ctx)
		return
	}
	d.schedulePublish()
}

func (d *Driver) reindex() {
	clear(d.byName)
	for i := range d.gpus {
		d.byName[d.gpus[i].Name] = &d.gpus[i]
	}
	for _, es := range d.nics {
		for i := range es {
			d.byName[es[i].Name] = &es[i]
		}
	}
}
