package nvml

import (
	"fmt"
	"maps"
	"slices"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MIGState is each GPU's MIG layout as a cheap look sees it, by GPU UUID:
// NVML has no event for a MIG reconfiguration (nvidia-smi or mig-manager
// creating or destroying instances, or a MIG mode change taking effect at a
// reset), so a running plugin polls it with ReadMIGState and rediscovers
// when it differs.
type MIGState map[string]GPUMIG

// GPUMIG is one GPU's MIG layout: its current MIG mode (a pending mode
// takes effect only at the GPU's next reset, and changes nothing served
// until then) and the UUIDs of its MIG devices, sorted.
type GPUMIG struct {
	Enabled bool
	Devices []string
}

// MIGStateOf is the layout inv was discovered with.
func MIGStateOf(gpus []GPU) MIGState {
	out := make(MIGState, len(gpus))
	for _, g := range gpus {
		m := GPUMIG{Enabled: g.MIGEnabled}
		for _, d := range g.MIG {
			m.Devices = append(m.Devices, d.UUID)
		}
		slices.Sort(m.Devices)
		out[g.UUID] = m
	}
	return out
}

// ReadMIGState reads the MIG layout of the GPUs with these UUIDs: per
// GPU its MIG mode, and in MIG mode the UUID in each MIG device slot. It
// costs a few NVML calls per GPU, far less than Discover. A GPU that cannot
// be read is left out (health reports a lost GPU), as is one whose MIG
// devices cannot all be read: half a reading is no layout to act on.
func ReadMIGState(lib Library, syms Symbols, uuids []string) MIGState {
	out := make(MIGState, len(uuids))
	if !syms.Has(symMigMode) {
		return out // no MIG, never a change
	}
	for _, uuid := range uuids {
		if m, err := readGPUMIG(lib, syms, uuid); err == nil {
			out[uuid] = m
		}
	}
	return out
}

func readGPUMIG(lib Library, syms Symbols, uuid string) (GPUMIG, error) {
	h, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return GPUMIG{}, fmt.Errorf("getting handle: %w", ret)
	}
	cur, _, ret := h.GetMigMode()
	switch {
	case ret == gonvml.ERROR_NOT_SUPPORTED:
		return GPUMIG{}, nil
	case ret != gonvml.SUCCESS:
		return GPUMIG{}, fmt.Errorf("reading MIG mode: %w", ret)
	}
	m := GPUMIG{Enabled: cur == gonvml.DEVICE_MIG_ENABLE}
	if !m.Enabled || !syms.hasMIGListing() {
		return m, nil
	}
	slots, ret := h.GetMaxMigDeviceCount()
	if ret != gonvml.SUCCESS {
		return GPUMIG{}, fmt.Errorf("counting MIG device slots: %w", ret)
	}
	for idx := range slots {
		mh, ret := h.GetMigDeviceHandleByIndex(idx)
		if ret == gonvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != gonvml.SUCCESS {
			return GPUMIG{}, fmt.Errorf("getting MIG device %d: %w", idx, ret)
		}
		id, ret := mh.GetUUID()
		if ret != gonvml.SUCCESS {
			return GPUMIG{}, fmt.Errorf("reading MIG device %d's UUID: %w", idx, ret)
		}
		m.Devices = append(m.Devices, id)
	}
	slices.Sort(m.Devices)
	return m, nil
}

// Changes says how now differs from was, one phrase per GPU that changed
// ("GPU-x: MIG mode on", "GPU-y: 2 MIG devices added, 1 removed"), in UUID
// order; none when the layouts are the same. Only GPUs both hold are
// compared: a GPU that could not be read is no layout change.
func (was MIGState) Changes(now MIGState) []string {
	var out []string
	for _, uuid := range slices.Sorted(maps.Keys(was)) {
		a := was[uuid]
		b, ok := now[uuid]
		if !ok {
			continue
		}
		if a.Enabled != b.Enabled {
			mode := "off"
			if b.Enabled {
				mode = "on"
			}
			out = append(out, fmt.Sprintf("%s: MIG mode %s", uuid, mode))
			continue
		}
		added, removed := 0, 0
		for _, d := range b.Devices {
			if !slices.Contains(a.Devices, d) {
				added++
			}
		}
		for _, d := range a.Devices {
			if !slices.Contains(b.Devices, d) {
				removed++
			}
		}
		if added+removed > 0 {
			out = append(out, fmt.Sprintf("%s: %d MIG devices added, %d removed", uuid, added, removed))
		}
	}
	return out
}
