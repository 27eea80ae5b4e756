package dra

import (
	"fmt"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvcaps"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// nvmlInstances is MIGInstances through NVML, with the capability minors
// read from the driver's procfs and the host's nodes made.
type nvmlInstances struct {
	p                 *nvml.Partitioner
	devRoot, procRoot string
}

func (n nvmlInstances) Create(g nvml.GPU, pl nvml.MIGPlacement) (nvml.MIGDevice, error) {
	m, err := n.p.Create(g, pl)
	if err != nil {
		return m, err
	}
	if err := n.caps(g, &m); err != nil {
		if derr := n.p.Destroy(g, m.GPUInstance); derr != nil {
			return nvml.MIGDevice{}, fmt.Errorf("%w; destroying it again: %w (%w)", err, derr, nvml.ErrLeftBehind)
		}
		return nvml.MIGDevice{}, err
	}
	return m, nil
}

func (n nvmlInstances) Find(g nvml.GPU, gi int) (nvml.MIGDevice, bool, error) {
	m, found, err := n.p.Find(g, gi)
	if err != nil || !found {
		return m, found, err
	}
	if err := n.caps(g, &m); err != nil {
		return nvml.MIGDevice{}, false, err
	}
	return m, true, nil
}

func (n nvmlInstances) Destroy(g nvml.GPU, gi int) error { return n.p.Destroy(g, gi) }

func (n nvmlInstances) Instances(g nvml.GPU) ([]nvml.GPUInstance, error) {
	l, err := n.p.Layout(g)
	return l.Instances, err
}

// caps reads m's access capability minors and makes their host nodes.
func (n nvmlInstances) caps(g nvml.GPU, m *nvml.MIGDevice) error {
	minors, err := nvcaps.MIGMinors(n.procRoot, g.Minor, m.GPUInstance, m.ComputeInstance)
	if err != nil {
		return fmt.Errorf("MIG device %s: %w", m.UUID, err)
	}
	if err := nvcaps.EnsureNodes(n.devRoot, n.procRoot, minors); err != nil {
		return fmt.Errorf("MIG device %s: %w", m.UUID, err)
	}
	m.CapMinors = minors
	return nil
}
