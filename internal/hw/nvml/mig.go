package nvml

import (
	"fmt"
	"log/slog"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// migLister lists the MIG devices of the GPUs one Discover walks. It
// carries what is said once per discovery rather than once per device.
type migLister struct {
	syms Symbols
	log  *slog.Logger
	// profileIDFailed is set after the first GPU instance whose profile
	// could not be read has been logged.
	profileIDFailed bool
}

// list returns the MIG devices of g, a GPU in MIG mode with handle h, by
// MIG device index. It never fails: a MIG device that cannot be read is
// logged and left out, and any failure leaves g itself in the inventory.
func (l *migLister) list(h gonvml.Device, g *GPU) []MIGDevice {
	if !l.syms.hasMIGListing() {
		// Discover has named the missing functions in one line.
		l.log.Warn("GPU is in MIG mode but the NVML library cannot list MIG devices; nothing of it is served", "device", g.UUID)
		return nil
	}
	slots, ret := h.GetMaxMigDeviceCount()
	if ret != gonvml.SUCCESS {
		l.log.Error("counting MIG device slots; none of the GPU's MIG devices is served", "device", g.UUID, "reason", ret.Error())
		return nil
	}
	profiles := &gpuProfiles{suffixes: map[int]string{}}
	var out []MIGDevice
	skipped := 0
	for idx := range slots {
		mh, ret := h.GetMigDeviceHandleByIndex(idx)
		if ret == gonvml.ERROR_NOT_FOUND {
			continue // an empty slot
		}
		if ret != gonvml.SUCCESS {
			l.log.Error("skipping MIG device", "device", g.UUID, "migIndex", idx, "reason", fmt.Errorf("getting handle: %w", ret).Error())
			skipped++
			continue
		}
		m, err := l.read(h, mh, g, idx, profiles)
		if err != nil {
			l.log.Error("skipping MIG device", "device", g.UUID, "migIndex", idx, "reason", err.Error())
			skipped++
			continue
		}
		out = append(out, m)
	}
	logMIG(g, out, skipped, l.log)
	return out
}

// logMIG says, once per GPU in MIG mode, what it holds; what is served of
// it is the serving side's decision (MIG strategy, DRA).
func logMIG(g *GPU, migs []MIGDevice, skipped int, log *slog.Logger) {
	if len(migs) == 0 && skipped > 0 {
		log.Warn("GPU is in MIG mode but none of its MIG devices could be read; nothing of it is served", "device", g.UUID, "index", g.Index, "skipped", skipped)
		return
	}
	if len(migs) == 0 {
		// Whether that serves nothing is the serving side's to say, once
		// (gpu.Layout's warning; DRA may create instances itself).
		log.Debug("GPU is in MIG mode with no MIG devices", "device", g.UUID, "index", g.Index)
		return
	}
	profiles := make([]string, len(migs))
	for k, m := range migs {
		profiles[k] = m.Profile
	}
	log.Info("GPU is in MIG mode", "device", g.UUID, "index", g.Index, "migDevices", len(migs), "profiles", strings.Join(profiles, ","), "skipped", skipped)
}

// read reads the MIG device at index idx of g. Its identity (UUID,
// instance IDs) and attributes (for the profile name) are mandatory; its
// memory falls back to the attributes' figure.
func (l *migLister) read(parent, mh gonvml.Device, g *GPU, idx int, profiles *gpuProfiles) (MIGDevice, error) {
	uuid, ret := mh.GetUUID()
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, fmt.Errorf("reading UUID: %w", ret)
	}
	gi, ret := mh.GetGpuInstanceId()
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, fmt.Errorf("reading GPU instance id of %s: %w", uuid, ret)
	}
	ci, ret := mh.GetComputeInstanceId()
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, fmt.Errorf("reading compute instance id of %s: %w", uuid, ret)
	}
	attrs, ret := mh.GetAttributes()
	if ret != gonvml.SUCCESS {
		return MIGDevice{}, fmt.Errorf("reading attributes of %s: %w", uuid, ret)
	}
	suffix, ok := profiles.suffixes[gi]
	if !ok {
		suffix = l.suffix(parent, g, gi, uuid, profiles)
		profiles.suffixes[gi] = suffix
	}
	profile, err := profileName(attrs, g.MemoryBytes, suffix)
	if err != nil {
		return MIGDevice{}, fmt.Errorf("naming the profile of %s: %w", uuid, err)
	}
	m := MIGDevice{
		UUID:            uuid,
		Index:           idx,
		GPUInstance:     gi,
		ComputeInstance: ci,
		Profile:         profile,
		MemoryBytes:     attrs.MemorySizeMB << 20,
		Multiprocessors: int(attrs.MultiprocessorCount),
		Slices:          Slices{GPUInstance: int(attrs.GpuInstanceSliceCount), ComputeInstance: int(attrs.ComputeInstanceSliceCount)},
		Engines: Engines{
			Copy: int(attrs.SharedCopyEngineCount), Decoder: int(attrs.SharedDecoderCount),
			Encoder: int(attrs.SharedEncoderCount), JPEG: int(attrs.SharedJpegCount), OFA: int(attrs.SharedOfaCount),
		},
	}
	if mem, ret := mh.GetMemoryInfo(); ret == gonvml.SUCCESS && mem.Total > 0 {
		m.MemoryBytes = mem.Total
	}
	return m, nil
}

// gpuProfiles is what the MIG devices of one GPU share, read once per
// discovery.
type gpuProfiles struct {
	// suffixes are the profile suffixes by GPU instance id: the compute
	// instances of one GPU instance share it.
	suffixes map[int]string
	// indices maps the GPU's profile IDs to their NVML profile indices;
	// indexErr is the first index that could not be read. Both are read
	// at the first GPU instance.
	indices  map[uint32]int
	indexErr error
	// unknown are the profile IDs matching no index, warned once each.
	unknown map[uint32]bool
}

// suffix reads the profile suffix of GPU instance gi of g. The profile is
// only on the GPU instance, which NVML may not show (no permission in a
// container without the MIG monitor capability, vGPU guests): then the
// name has no suffix, said once per discovery.
func (l *migLister) suffix(parent gonvml.Device, g *GPU, gi int, uuid string, profiles *gpuProfiles) string {
	inst, ret := parent.GetGpuInstanceById(gi)
	var info gonvml.GpuInstanceInfo
	if ret == gonvml.SUCCESS {
		info, ret = inst.GetInfo()
	}
	if ret != gonvml.SUCCESS {
		l.profileUnreadable(g, gi, uuid, ret)
		return ""
	}
	if profiles.indices == nil {
		profiles.indices, profiles.indexErr = l.profileIndices(parent)
	}
	index, ok := profiles.indices[info.ProfileId]
	switch {
	case ok:
		return profileSuffix(index)
	case profiles.indexErr != nil:
		// The ID may be the profile that could not be read.
		l.profileUnreadable(g, gi, uuid, profiles.indexErr)
	case !profiles.unknown[info.ProfileId]:
		if profiles.unknown == nil {
			profiles.unknown = map[uint32]bool{}
		}
		profiles.unknown[info.ProfileId] = true
		l.log.Warn("GPU instance profile ID matches no profile index the plugin knows; its MIG devices are named without a +me/+gfx/-me suffix",
			"device", g.UUID, "profileID", info.ProfileId, "gpuInstance", gi, "mig", uuid)
	}
	return ""
}

// profileUnreadable says, once per discovery, that profile names lack
// their suffix.
func (l *migLister) profileUnreadable(g *GPU, gi int, uuid string, err error) {
	if l.profileIDFailed {
		return
	}
	l.profileIDFailed = true
	l.log.Warn("reading the GPU instance profile; MIG profile names lack their +me/+gfx/-me suffix (further failures are not logged)",
		"device", g.UUID, "gpuInstance", gi, "mig", uuid, "reason", err.Error())
}

// profileIndices maps the GPU instance profile IDs of GPU h to their NVML
// profile indices (GPU_INSTANCE_PROFILE_*). A GPU instance carries the
// profile's ID, which the driver numbers per GPU (nvidia-smi mig -lgip:
// an H100's 2g.20gb is index 1, ID 14); what the profile is, and so its
// suffix, is known by the index. An index the GPU lacks answers
// NOT_SUPPORTED, one the driver does not know INVALID_ARGUMENT.
func (l *migLister) profileIndices(h gonvml.Device) (map[uint32]int, error) {
	indices := map[uint32]int{}
	var err error
	for index := range gonvml.GPU_INSTANCE_PROFILE_COUNT {
		id, ret := l.profileID(h, index)
		switch ret {
		case gonvml.SUCCESS:
			indices[id] = index
		case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_INVALID_ARGUMENT:
		default:
			if err == nil {
				err = fmt.Errorf("reading GPU instance profile %d: %w", index, ret)
			}
		}
	}
	return indices, err
}

// profileID reads the ID of the profile at NVML profile index index.
func (l *migLister) profileID(h gonvml.Device, index int) (uint32, gonvml.Return) {
	if l.syms.Has(symGIProfileInfoV) {
		info, ret := h.GetGpuInstanceProfileInfoV(index).V2()
		return info.Id, ret
	}
	info, ret := h.GetGpuInstanceProfileInfo(index)
	return info.Id, ret
}

// profileSuffix marks GPU instance profiles that differ from the plain
// one of the same size in their media engines or graphics support, as
// nvidia-smi names them, by NVML profile index. REV2 (more memory per
// slice) shows in the memory, not in a suffix.
func profileSuffix(index int) string {
	switch index {
	case gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, gonvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		return "+me"
	case gonvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, gonvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		gonvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, gonvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		return "+gfx"
	case gonvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, gonvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		return "-me"
	case gonvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, gonvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		return "+me.all"
	}
	return ""
}

// profileName names a MIG device as NVIDIA does: "<g>g.<mem>gb", or
// "<c>c.<g>g.<mem>gb" when the compute instance has fewer slices than its
// GPU instance, then the GPU instance profile's suffix.
func profileName(a gonvml.DeviceAttributes, parentBytes uint64, suffix string) (string, error) {
	g, c := a.GpuInstanceSliceCount, a.ComputeInstanceSliceCount
	if g == 0 || a.MemorySizeMB == 0 {
		return "", fmt.Errorf("attributes give %d GPU instance slices and %d MiB", g, a.MemorySizeMB)
	}
	mem := migMemoryGB(a.MemorySizeMB, parentBytes)
	if c > 0 && c < g {
		return fmt.Sprintf("%dc.%dg.%dgb%s", c, g, mem, suffix), nil
	}
	return fmt.Sprintf("%dg.%dgb%s", g, mem, suffix), nil
}

// migMemoryGB is the memory figure of a profile name. MIG splits memory in
// eighths, and the name counts the eighths the device holds, not its usable
// memory (the driver keeps some back): its share of the parent is rounded
// up to eighths, multiplied by the parent's memory in GB rounded up, and
// rounded to the nearest GB, halves up. So a 4864 MiB device of an
// A100-40GB is 1/8 of 40 GB, "5gb", and a 9856 MiB one of an H100-80GB
// (79.6 GiB) 1/8 of 80 GB, "10gb". With the parent's memory unknown, the
// device's own memory rounded up to GB is the best guess left.
func migMemoryGB(migMiB, parentBytes uint64) uint64 {
	const mib, gib = 1 << 20, 1 << 30
	if parentBytes == 0 {
		return ceilDiv(migMiB, 1024)
	}
	eighths := ceilDiv(migMiB*mib*8, parentBytes)
	parentGB := ceilDiv(parentBytes, gib)
	return (eighths*parentGB + 4) / 8
}

func ceilDiv(a, b uint64) uint64 { return (a + b - 1) / b }
