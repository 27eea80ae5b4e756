package nvml

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MIGLayout is what a GPU in MIG mode allows: where a GPU instance of each
// profile may sit, and the GPU instances that exist now.
type MIGLayout struct {
	// MemorySlices and ComputeSlices are the GPU's: a placement's Start
	// and Size count memory slices (8 on an A100 or H100), and the GPU
	// instances on it hold at most ComputeSlices between them (7).
	MemorySlices  int            `json:"memorySlices"`
	ComputeSlices int            `json:"computeSlices"`
	Placements    []MIGPlacement `json:"placements"`
	Instances     []GPUInstance  `json:"instances,omitempty"`
}

// MIGPlacement is one place a GPU instance of one profile may be created.
type MIGPlacement struct {
	// ProfileIndex is NVML's profile index (GPU_INSTANCE_PROFILE_*),
	// ProfileID the driver's ID of that profile on this GPU, which the
	// create and list calls take: the two differ (an H100's 2g.20gb is
	// index 1, ID 14).
	ProfileIndex int    `json:"profileIndex"`
	ProfileID    uint32 `json:"profileID"`
	// Profile is NVIDIA's name for it ("3g.40gb", "1g.10gb+me").
	Profile string `json:"profile"`
	// Start and Size are in memory slices.
	Start int `json:"start"`
	Size  int `json:"size"`
	// ComputeSlices is how many of the GPU's compute slices it holds.
	ComputeSlices int `json:"computeSlices"`
	// Instances is how many GPU instances of the profile the GPU holds
	// at most, whatever the placements left: one 1g.10gb+me, as the GPU
	// has one set of media engines.
	Instances       int    `json:"instances"`
	MemoryBytes     uint64 `json:"memoryBytes"`
	Multiprocessors int    `json:"multiprocessors"`
}

// Overlaps says whether the two placements share a memory slice.
func (p MIGPlacement) Overlaps(start, size int) bool {
	return p.Start < start+size && start < p.Start+p.Size
}

// GPUInstance is a GPU instance that exists: its ID (which is neither a
// placement nor a MIG device index) and where it sits.
type GPUInstance struct {
	ID        int    `json:"id"`
	ProfileID uint32 `json:"profileID"`
	Start     int    `json:"start"`
	Size      int    `json:"size"`
}

// partitionSymbols are the functions partitioning needs besides MIG
// listing. go-nvml calls a versioned one where the library has it, else
// the first version: either will do ("a|b").
var partitionSymbols = []string{
	"nvmlDeviceGetGpuInstancePossiblePlacements_v2|nvmlDeviceGetGpuInstancePossiblePlacements",
	"nvmlDeviceCreateGpuInstanceWithPlacement",
	"nvmlDeviceGetGpuInstances",
	"nvmlGpuInstanceGetComputeInstanceProfileInfo",
	"nvmlGpuInstanceCreateComputeInstance",
	"nvmlGpuInstanceGetComputeInstanceById",
	"nvmlGpuInstanceGetComputeInstances",
	"nvmlComputeInstanceGetInfo_v2|nvmlComputeInstanceGetInfo",
	"nvmlComputeInstanceDestroy",
	"nvmlGpuInstanceDestroy",
}

// Partitioner creates and destroys MIG instances on GPUs in MIG mode, one
// call at a time: NVML serialises MIG reconfiguration per GPU anyway, and
// a create must not race the listing that finds its MIG device.
type Partitioner struct {
	lib  Library
	syms Symbols
	log  *slog.Logger
	mu   sync.Mutex
}

// NewPartitioner checks that the library can partition GPUs: MIG listing
// and every function in partitionSymbols. The error names what is missing.
func NewPartitioner(lib Library, log *slog.Logger) (*Partitioner, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	syms := CheckSymbols(lib)
	var missing []string
	if !syms.hasMIGListing() {
		missing = append(missing, "MIG device listing")
	}
	if ext := lib.Extensions(); ext == nil {
		missing = append(missing, "symbol lookup")
	} else {
		for _, s := range partitionSymbols {
			if !slices.ContainsFunc(strings.Split(s, "|"), func(name string) bool { return ext.LookupSymbol(name) == nil }) {
				missing = append(missing, strings.ReplaceAll(s, "|", " or "))
			}
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("the NVML library cannot create MIG instances: it lacks %s", strings.Join(missing, ", "))
	}
	return &Partitioner{lib: lib, syms: syms, log: log}, nil
}

// Layout reads the placements GPU g (in MIG mode) allows, for every
// profile it offers, and the GPU instances on it.
func (p *Partitioner) Layout(g GPU) (MIGLayout, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ret := p.lib.DeviceGetHandleByUUID(g.UUID)
	if ret != gonvml.SUCCESS {
		return MIGLayout{}, fmt.Errorf("GPU %s: %w", g.UUID, ret)
	}
	var out MIGLayout
	for index := range gonvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := h.GetGpuInstanceProfileInfo(index)
		switch ret {
		case gonvml.SUCCESS:
		case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_INVALID_ARGUMENT:
			continue // a profile this GPU or driver does not have
		default:
			return MIGLayout{}, fmt.Errorf("GPU %s: reading GPU instance profile %d: %w", g.UUID, index, ret)
		}
		places, ret := h.GetGpuInstancePossiblePlacements(&info)
		if ret != gonvml.SUCCESS {
			return MIGLayout{}, fmt.Errorf("GPU %s: reading the placements of GPU instance profile %d (ID %d): %w", g.UUID, index, info.Id, ret)
		}
		name := fmt.Sprintf("%dg.%dgb%s", info.SliceCount, migMemoryGB(info.MemorySizeMB, g.MemoryBytes), profileSuffix(index))
		out.ComputeSlices = max(out.ComputeSlices, int(info.SliceCount))
		for _, pl := range places {
			out.MemorySlices = max(out.MemorySlices, int(pl.Start+pl.Size))
			out.Placements = append(out.Placements, MIGPlacement{
				ProfileIndex: index, ProfileID: info.Id, Profile: name, Start: int(pl.Start), Size: int(pl.Size),
				ComputeSlices: int(info.SliceCount), Instances: int(info.InstanceCount), MemoryBytes: info.MemorySizeMB << 20, Multiprocessors: int(info.MultiprocessorCount),
			})
		}
		gis, ret := h.GetGpuInstances(&info)
		if ret != gonvml.SUCCESS {
			return MIGLayout{}, fmt.Errorf("GPU %s: listing GPU instances of profile ID %d: %w", g.UUID, info.Id, ret)
		}
		for _, gi := range gis {
			gii, ret := gi.GetInfo()
			if ret != gonvml.SUCCESS {
				return MIGLayout{}, fmt.Errorf("GPU %s: reading a GPU instance of profile ID %d: %w", g.UUID, info.Id, ret)
			}
			out.Instances = append(out.Instances, GPUInstance{ID: int(gii.Id), ProfileID: gii.ProfileId, Start: int(gii.Placement.Start), Size: int(gii.Placement.Size)})
		}
	}
	if len(out.Placements) == 0 {
		return MIGLayout{}, fmt.Errorf("GPU %s offers no GPU instance placement", g.UUID)
	}
	slices.SortFunc(out.Instances, func(a, b GPUInstance) int { return a.ID - b.ID })
	return out, nil
}

// ErrPlacementTaken is Create's error when the placement, or the compute
// slices it needs, are held by another GPU instance.
var ErrPlacementTaken = errors.New("the placement is taken by another GPU instance")

// ErrLeftBehind is Create's error when a later step failed and the GPU
// instance it had created could not be destroyed again: it is still there.
var ErrLeftBehind = errors.New("the GPU instance created is left behind")

// Create makes a GPU instance of pl's profile at pl on GPU g, with one
// compute instance spanning it, and returns the MIG device they make
// (UUID, instance IDs, profile; CapMinors are nvcaps'). When a later step
// fails, what was created is destroyed again.
func (p *Partitioner) Create(g GPU, pl MIGPlacement) (MIGDevice, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ret := p.lib.DeviceGetHandleByUUID(g.UUID)
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, fmt.Errorf("GPU %s: %w", g.UUID, ret)
	}
	info, ret := h.GetGpuInstanceProfileInfo(pl.ProfileIndex)
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, fmt.Errorf("GPU %s: reading GPU instance profile %d: %w", g.UUID, pl.ProfileIndex, ret)
	}
	if info.Id != pl.ProfileID {
		return MIGDevice{}, fmt.Errorf("GPU %s: profile %s has ID %d now, not %d as published", g.UUID, pl.Profile, info.Id, pl.ProfileID)
	}
	gi, ret := h.CreateGpuInstanceWithPlacement(&info, &gonvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
	switch ret {
	case gonvml.SUCCESS:
	case gonvml.ERROR_INSUFFICIENT_RESOURCES:
		return MIGDevice{}, fmt.Errorf("GPU %s: creating a %s GPU instance at slice %d: %w (%w)", g.UUID, pl.Profile, pl.Start, ErrPlacementTaken, ret)
	default:
		return MIGDevice{}, fmt.Errorf("GPU %s: creating a %s GPU instance at slice %d: %w", g.UUID, pl.Profile, pl.Start, ret)
	}
	m, err := p.fill(h, gi, g, info)
	if err != nil {
		if derr := destroyGI(gi); derr != nil {
			return MIGDevice{}, fmt.Errorf("GPU %s: %s at slice %d: %w; destroying it again: %w (%w)", g.UUID, pl.Profile, pl.Start, err, derr, ErrLeftBehind)
		}
		return MIGDevice{}, fmt.Errorf("GPU %s: %s at slice %d: %w", g.UUID, pl.Profile, pl.Start, err)
	}
	return m, nil
}

// fill creates the compute instance spanning gi and reads the MIG device.
func (p *Partitioner) fill(h gonvml.Device, gi gonvml.GpuInstance, g GPU, info gonvml.GpuInstanceProfileInfo) (MIGDevice, error) {
	giInfo, ret := gi.GetInfo()
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, fmt.Errorf("reading the new GPU instance: %w", ret)
	}
	ciInfo, err := fullComputeProfile(gi, info.SliceCount)
	if err != nil {
		return MIGDevice{}, err
	}
	ci, ret := gi.CreateComputeInstance(&ciInfo)
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, fmt.Errorf("creating its compute instance: %w", ret)
	}
	ciI, ret := ci.GetInfo()
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, fmt.Errorf("reading its compute instance: %w", ret)
	}
	m, err := p.find(h, g, int(giInfo.Id), int(ciI.Id))
	if err != nil {
		return MIGDevice{}, err
	}
	return m, nil
}

// fullComputeProfile is the compute instance profile spanning a GPU
// instance of slices slices: the plain one of that size.
func fullComputeProfile(gi gonvml.GpuInstance, slices uint32) (gonvml.ComputeInstanceProfileInfo, error) {
	for index := range gonvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		if index == gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1 {
			continue
		}
		info, ret := gi.GetComputeInstanceProfileInfo(index, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == gonvml.SUCCESS && info.SliceCount == slices {
			return info, nil
		}
	}
	return gonvml.ComputeInstanceProfileInfo{}, fmt.Errorf("no compute instance profile of %d slices on the GPU instance", slices)
}

// find reads the MIG device of GPU instance gi, compute instance ci.
func (p *Partitioner) find(h gonvml.Device, g GPU, gi, ci int) (MIGDevice, error) {
	slots, ret := h.GetMaxMigDeviceCount()
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, fmt.Errorf("counting MIG device slots: %w", ret)
	}
	l := &migLister{syms: p.syms, log: p.log}
	profiles := &gpuProfiles{suffixes: map[int]string{}}
	for idx := range slots {
		mh, ret := h.GetMigDeviceHandleByIndex(idx)
		if ret != gonvml.SUCCESS {
			continue
		}
		gid, r1 := mh.GetGpuInstanceId()
		cid, r2 := mh.GetComputeInstanceId()
		if r1 != gonvml.SUCCESS || r2 != gonvml.SUCCESS || gid != gi || cid != ci {
			continue
		}
		return l.read(h, mh, &g, idx, profiles)
	}
	return MIGDevice{}, fmt.Errorf("no MIG device for GPU instance %d, compute instance %d", gi, ci)
}

// Find reads the MIG device of GPU instance gi on GPU g (its first compute
// instance); found false when the GPU instance is gone.
func (p *Partitioner) Find(g GPU, gi int) (MIGDevice, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ret := p.lib.DeviceGetHandleByUUID(g.UUID)
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, false, fmt.Errorf("GPU %s: %w", g.UUID, ret)
	}
	inst, ret := h.GetGpuInstanceById(gi)
	switch ret {
	case gonvml.SUCCESS:
	case gonvml.ERROR_NOT_FOUND, gonvml.ERROR_INVALID_ARGUMENT:
		return MIGDevice{}, false, nil
	default:
		return MIGDevice{}, false, fmt.Errorf("GPU %s: GPU instance %d: %w", g.UUID, gi, ret)
	}
	info, ret := inst.GetInfo()
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, false, fmt.Errorf("GPU %s: GPU instance %d: %w", g.UUID, gi, ret)
	}
	pinfo, ret := h.GetGpuInstanceProfileInfo(profileIndexOf(h, info.ProfileId))
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, false, fmt.Errorf("GPU %s: profile of GPU instance %d: %w", g.UUID, gi, ret)
	}
	ciInfo, err := fullComputeProfile(inst, pinfo.SliceCount)
	if err != nil {
		return MIGDevice{}, false, err
	}
	cis, ret := inst.GetComputeInstances(&ciInfo)
	if ret != gonvml.SUCCESS || len(cis) == 0 {
		return MIGDevice{}, false, nil
	}
	ciI, ret := cis[0].GetInfo()
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, false, fmt.Errorf("GPU %s: compute instance of GPU instance %d: %w", g.UUID, gi, ret)
	}
	m, err := p.find(h, g, gi, int(ciI.Id))
	if err != nil {
		return MIGDevice{}, false, err
	}
	return m, true, nil
}

// profileIndexOf is the profile index whose ID is id on h, or -1.
func profileIndexOf(h gonvml.Device, id uint32) int {
	for index := range gonvml.GPU_INSTANCE_PROFILE_COUNT {
		if info, ret := h.GetGpuInstanceProfileInfo(index); ret == gonvml.SUCCESS && info.Id == id {
			return index
		}
	}
	return -1
}

// Destroy removes GPU instance gi of GPU g and its compute instances. One
// already gone is no error: Unprepare is retried, and a reboot removes
// every instance.
func (p *Partitioner) Destroy(g GPU, gi int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ret := p.lib.DeviceGetHandleByUUID(g.UUID)
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("GPU %s: %w", g.UUID, ret)
	}
	inst, ret := h.GetGpuInstanceById(gi)
	switch ret {
	case gonvml.SUCCESS:
	case gonvml.ERROR_NOT_FOUND, gonvml.ERROR_INVALID_ARGUMENT:
		return nil
	default:
		return fmt.Errorf("GPU %s: GPU instance %d: %w", g.UUID, gi, ret)
	}
	if err := destroyGI(inst); err != nil {
		return fmt.Errorf("GPU %s: destroying GPU instance %d: %w", g.UUID, gi, err)
	}
	return nil
}

// destroyGI destroys gi's compute instances, then gi: NVML refuses to
// destroy a GPU instance that still has compute instances (IN_USE).
func destroyGI(gi gonvml.GpuInstance) error {
	for index := range gonvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(index, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != gonvml.SUCCESS {
			continue
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret != gonvml.SUCCESS {
			continue
		}
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != gonvml.SUCCESS && ret != gonvml.ERROR_NOT_FOUND {
				return fmt.Errorf("destroying a compute instance: %w", ret)
			}
		}
	}
	if ret := gi.Destroy(); ret != gonvml.SUCCESS && ret != gonvml.ERROR_NOT_FOUND {
		if ret == gonvml.ERROR_IN_USE {
			return fmt.Errorf("%w: a process still uses it", ret)
		}
		return ret
	}
	return nil
}
