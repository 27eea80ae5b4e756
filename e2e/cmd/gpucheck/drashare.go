package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
)

// draShareData is the DRA step's memory share: a claim for a quarter of
// a GPU's memory, prepared as an MPS client.
type draShareData struct {
	Device     string   `json:"device"`
	ShareMiB   uint64   `json:"shareMiB"`
	PrepareMs  float64  `json:"prepareMs"`
	CDIDevices []string `json:"cdiDevices"`
	// Env is what the claim's MPS spec device sets.
	Env          []string      `json:"env"`
	Container    *containerRun `json:"container,omitempty"`
	Limit        []mpsAlloc    `json:"limit,omitempty"`
	LimitSkipped string        `json:"limitSkipped,omitempty"`
	// DaemonGone: the GPU's MPS directory was removed once the claim was
	// unprepared (the daemon stopped).
	DaemonGone bool `json:"daemonGone"`
}

// draShare prepares a claim for a quarter of gpu's memory, as the
// scheduler allocates one on a GPU published with consumable memory: the
// claim must come with the GPU's MPS client device whose limit is that
// memory, a container on it must reach the daemon (on a real GPU: an
// allocation over the share is refused, one under it granted), and the
// daemon must stop once the claim is unprepared.
func (c *checker) draShare(ctx context.Context, s *Step, k *harness.DRAKubelet, pool string, gpu *resourceapi.Device, specDir, mpsRoot string) *draShareData {
	data := &draShareData{Device: gpu.Name}
	if !s.check("memory share: the GPU is published for several claims", ptr.Deref(gpu.AllowMultipleAllocations, false),
		"allowMultipleAllocations %v (sharing.memoryShares is on)", gpu.AllowMultipleAllocations) {
		return data
	}
	total := gpu.Capacity["memory"].Value
	data.ShareMiB = uint64(total.Value()) >> 20 / 4
	uuid := ptr.Deref(gpu.Attributes["uuid"].StringValue, "")
	share := types.UID("00000000-0000-4000-8000-00000000c0de")
	r := resourceapi.DeviceRequestAllocationResult{
		Request: draRequest, Driver: config.DRADriverName, Pool: pool, Device: gpu.Name, ShareID: &share,
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": *resource.NewQuantity(int64(data.ShareMiB)<<20, resource.BinarySI)},
	}
	pod, err := c.claim(ctx, k, "share", r)
	if !s.check("memory share: claim created", err == nil, "%s", errText(err)) {
		return data
	}
	t := time.Now()
	err = k.Manager.PrepareResources(ctx, pod)
	data.PrepareMs = harness.Millis(time.Since(t))
	if !s.check("memory share: prepared (the GPU's MPS daemon started)", err == nil, "%s", errText(err)) {
		return data
	}
	defer func() {
		k.Remove(pod)
		err := k.Manager.UnprepareResources(ctx, pod)
		s.check("memory share: unprepared", err == nil, "%s", errText(err))
		// The daemon is stopped, and its directory removed, before
		// Unprepare returns.
		dir := filepath.Join(mpsRoot, uuid)
		data.DaemonGone = !exists(dir)
		s.check("memory share: the daemon stopped with its last claim", data.DaemonGone, "%s still there", dir)
	}()
	info, err := k.Manager.GetResources(pod, &pod.Spec.Containers[0])
	if !s.check("memory share: CDI devices for the container", err == nil && info != nil, "%s", errText(err)) {
		return data
	}
	var client string
	ours, metadata := 0, 0
	for _, d := range info.CDIDevices {
		data.CDIDevices = append(data.CDIDevices, d.Name)
		if strings.HasPrefix(d.Name, cdi.MPSKind+"=") {
			client = strings.TrimPrefix(d.Name, cdi.MPSKind+"=")
		}
		// The device metadata file (KEP-5304, draDeviceMetadata) comes as
		// a CDI device of the helper library's own kind.
		if strings.Contains(d.Name, "/metadata=") {
			metadata++
		} else {
			ours++
		}
	}
	if !s.check("memory share: the GPU's and an MPS client's CDI devices, and the device metadata's", client != "" && ours == 2 && metadata == 1, "%v", data.CDIDevices) {
		return data
	}
	data.Env, err = specEnv(specDir, client)
	want := []string{fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM", data.ShareMiB), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_PIPE_DIRECTORY=" + mpsPipeMount}
	s.check("memory share: its limit is the memory it was allocated", err == nil && subset(want, data.Env), "%v %s; want %v", data.Env, errText(err), want)

	rootfs, err := c.image(debian)
	if !s.check("memory share: image builds", err == nil, "%s", errText(err)) {
		return data
	}
	run := func(name string, mib uint64) *probeReport {
		x := extras{env: []string{"CUDAPROBE_LIST=" + mpsPipeMount}}
		if mib > 0 {
			x.env = append(x.env, fmt.Sprintf("CUDAPROBE_ALLOC_MIB=%d", mib))
		}
		began := time.Now()
		cr := &containerRun{Image: debian.Name, GPUs: []string{uuid}, CDI: data.CDIDevices}
		data.Container = cr
		out, stderr, err := c.runContainer(ctx, rootfs, specDir, data.CDIDevices, fmt.Sprintf("dra-share-%d", time.Now().UnixNano()), x)
		cr.Seconds, cr.Stderr = roundSeconds(time.Since(began)), oneLine(stderr, 2000)
		if !s.check("memory share: "+name+": runc runs it", err == nil, "%s", errText(err)) {
			return nil
		}
		p, err := parseProbe(out)
		if !s.check("memory share: "+name+": probe answers", err == nil, "%s", errText(err)) {
			return nil
		}
		cr.Probe = p
		if mib > 0 {
			data.Limit = append(data.Limit, mpsAlloc{Container: name, AllocMiB: mib, CtxCreate: p.CtxCreate, MemAlloc: p.MemAlloc, MemTotalMiB: p.MemTotalMiB})
		}
		return p
	}
	if c.mock {
		data.LimitSkipped = mpsLimitNotRun
		if p := run("container", 0); p != nil {
			s.check("memory share: "+mpsPipeMount+" holds the daemon's control socket", slices.Contains(p.Listed[mpsPipeMount], "control"), "%v %s", p.Listed[mpsPipeMount], p.ListErrors[mpsPipeMount])
		}
		return data
	}
	over, under := data.ShareMiB*5/4, data.ShareMiB/2
	if p := run("over its share", over); p != nil {
		s.check(fmt.Sprintf("memory share: cuMemAlloc of %d MiB, 1.25× its share, refused with CUDA_ERROR_OUT_OF_MEMORY", over),
			p.CtxCreate != nil && *p.CtxCreate == 0 && p.MemAlloc != nil && *p.MemAlloc == cudaOutOfMemory,
			"cuCtxCreate %v, cuMemAlloc %v %s; the client saw %d MiB total", deref(p.CtxCreate), deref(p.MemAlloc), p.AllocError, p.MemTotalMiB)
	}
	if p := run("under its share", under); p != nil {
		s.check(fmt.Sprintf("memory share: cuMemAlloc of %d MiB, half its share, granted", under),
			p.CtxCreate != nil && *p.CtxCreate == 0 && p.MemAlloc != nil && *p.MemAlloc == 0,
			"cuCtxCreate %v, cuMemAlloc %v %s", deref(p.CtxCreate), deref(p.MemAlloc), p.AllocError)
	}
	return data
}

// specEnv is the environment the CDI spec of the MPS clients sets for
// device name.
func specEnv(specDir, name string) ([]string, error) {
	w := cdi.Writer{Dir: specDir}
	path, err := w.Path(cdi.MPSKind)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, d := range spec.Devices {
		if d.Name == name {
			return d.ContainerEdits.Env, nil
		}
	}
	return nil, fmt.Errorf("%s has no device %s", path, name)
}

// draShareNotes are the summary's lines about the memory share.
func draShareNotes(d *draShareData) []string {
	if d == nil || d.ShareMiB == 0 {
		return nil
	}
	note := fmt.Sprintf("memory share: %d MiB of %s prepared in %.0f ms as an MPS client, env %s", d.ShareMiB, d.Device, d.PrepareMs, strings.Join(d.Env, " "))
	if d.LimitSkipped != "" {
		return []string{note, "memory share limit test: " + d.LimitSkipped}
	}
	var l []string
	for _, a := range d.Limit {
		l = append(l, fmt.Sprintf("%s: %d MiB → cuMemAlloc %v", a.Container, a.AllocMiB, deref(a.MemAlloc)))
	}
	return []string{note, "memory share limit test: " + strings.Join(l, "; ")}
}
