package remediate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/cudaprobe"
)

// NVMLGPUs is the Resetter of a real node: NVML's process lists, its drain,
// remove and rediscover reset, and its reads of a GPU after the reset.
// Around the reset it keeps what the plugin cannot put back refused, and
// what it can put back restored: a GPU in MIG mode is not reset (its
// instances would be lost), nor one whose compute mode is Prohibited; an
// exclusive-process mode is set again after the reset, which clears it.
type NVMLGPUs struct {
	Resetter *nvml.Resetter
	// GPUs are the node's GPUs, for their PCI bus IDs.
	GPUs []nvml.GPU
	// Rebound, if set, is told of each GPU a reset brought back, so the
	// health monitor reads it through its new handle.
	Rebound func(uuid string)
	// SetComputeMode sets a GPU's compute mode: exclusive-process or
	// default.
	SetComputeMode func(uuid string, exclusive bool) error

	mu     sync.Mutex
	before map[string]nvml.Condition // what a GPU was before its reset
}

var _ Resetter = (*NVMLGPUs)(nil)

// Processes counts the processes on the GPU; an error is "not known".
func (g *NVMLGPUs) Processes(uuid string) (int, error) {
	ps, err := g.Resetter.Processes(uuid)
	if err != nil {
		return 0, err
	}
	return len(ps), nil
}

// Reset resets the GPUs with uuids, one after the other. Every GPU is
// checked before the first is touched, so a refusal changes nothing.
func (g *NVMLGPUs) Reset(ctx context.Context, uuids []string) error {
	gpus := make([]nvml.GPU, 0, len(uuids))
	saved := map[string]nvml.Condition{}
	for _, uuid := range uuids {
		gpu, ok := g.gpu(uuid)
		if !ok {
			return fmt.Errorf("GPU %s: not among the node's GPUs; nothing was reset", uuid)
		}
		c, err := g.Resetter.Condition(uuid)
		if err != nil {
			return fmt.Errorf("reading GPU %s before its reset; nothing was reset: %w", uuid, err)
		}
		switch {
		case c.MIGEnabled:
			return fmt.Errorf("GPU %s has MIG mode on: a reset destroys its MIG instances, which this release does not make again; nothing was reset (reset it by hand, then make its instances again)", uuid)
		case c.ComputeMode == nvml.ComputeProhibited:
			return fmt.Errorf("GPU %s is in the Prohibited compute mode, which this release cannot set again after a reset; nothing was reset", uuid)
		}
		gpus, saved[uuid] = append(gpus, gpu), c
	}
	g.mu.Lock()
	if g.before == nil {
		g.before = map[string]nvml.Condition{}
	}
	for uuid, c := range saved {
		g.before[uuid] = c
	}
	g.mu.Unlock()
	for _, gpu := range gpus {
		if err := g.Resetter.Reset(ctx, gpu); err != nil {
			return err
		}
		if g.Rebound != nil {
			g.Rebound(gpu.UUID)
		}
		if saved[gpu.UUID].ComputeMode == nvml.ComputeExclusiveProcess && g.SetComputeMode != nil {
			if err := g.SetComputeMode(gpu.UUID, true); err != nil {
				return fmt.Errorf("GPU %s was reset, but its exclusive-process compute mode could not be set again: %w", gpu.UUID, err)
			}
		}
	}
	return nil
}

// Verify says whether the GPU reads clean after its reset, with the modes
// it had before (when this process saw it before the reset).
func (g *NVMLGPUs) Verify(uuid string) error {
	c, err := g.Resetter.Condition(uuid)
	if err != nil {
		return fmt.Errorf("reading GPU %s after its reset: %w", uuid, err)
	}
	if faults := c.Faults(); len(faults) > 0 {
		return fmt.Errorf("GPU %s is not clean after its reset: %s", uuid, strings.Join(faults, ", "))
	}
	g.mu.Lock()
	was, known := g.before[uuid]
	delete(g.before, uuid)
	g.mu.Unlock()
	if known && (c.ComputeMode != was.ComputeMode || c.MIGEnabled != was.MIGEnabled) {
		return fmt.Errorf("GPU %s came back with compute mode %v and MIG %t, not %v and MIG %t as before its reset", uuid, c.ComputeMode, c.MIGEnabled, was.ComputeMode, was.MIGEnabled)
	}
	return nil
}

func (g *NVMLGPUs) gpu(uuid string) (nvml.GPU, bool) {
	for _, gpu := range g.GPUs {
		if gpu.UUID == uuid {
			return gpu, true
		}
	}
	return nvml.GPU{}, false
}

// CUDAProbe is the Prober of a real node: a CUDA context made on the GPU
// in a confined process (package cudaprobe).
type CUDAProbe struct {
	// Options are the probe's, less the GPU.
	Options cudaprobe.Options
	GPUs    []nvml.GPU
}

var _ Prober = CUDAProbe{}

// errProbeFailed is a GPU the probe judged broken.
var errProbeFailed = errors.New("the CUDA probe failed")

// Probe runs the probe on the GPU with uuid.
func (p CUDAProbe) Probe(ctx context.Context, uuid string) error {
	o := p.Options
	for _, g := range p.GPUs {
		if g.UUID == uuid {
			o.PCIBusID, o.UUID, o.Minor = g.PCIBusID, g.UUID, g.Minor
		}
	}
	if o.UUID == "" {
		return fmt.Errorf("GPU %s: not among the node's GPUs", uuid)
	}
	res, err := cudaprobe.Run(ctx, o)
	if err != nil {
		return fmt.Errorf("the CUDA probe could not judge GPU %s: %w", uuid, err)
	}
	if !res.OK {
		return fmt.Errorf("%w on GPU %s: %s", errProbeFailed, uuid, res)
	}
	return nil
}
