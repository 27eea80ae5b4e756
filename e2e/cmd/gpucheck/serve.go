package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/klog/v2"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

// waitTimeout bounds each wait on the plugin or the kubelet's client.
const waitTimeout = 30 * time.Second

type serveData struct {
	Resource            string            `json:"resource"`
	Devices             int               `json:"devices"`
	RegisteredMs        float64           `json:"registeredMs"`
	FirstListMs         float64           `json:"firstListAndWatchMs"`
	Allocate            []harness.Latency `json:"allocate"`
	PreferredAllocation []harness.Latency `json:"preferredAllocation"`
	// Answers are Allocate's answers for one GPU and for all, as the
	// kubelet received them.
	Answers    map[string]answer `json:"answers"`
	PeakRSSMiB float64           `json:"peakRSSMiB"`
	// SideBySide is NVIDIA's device plugin against ours (-compare-runs).
	SideBySide *sideBySide `json:"sideBySide,omitempty"`
}

// answer is a ContainerAllocateResponse with the report's key style.
type answer struct {
	Envs        map[string]string `json:"envs,omitempty"`
	Devices     []string          `json:"devices,omitempty"` // host path:container path:permissions
	Mounts      []string          `json:"mounts,omitempty"`  // host path:container path[:ro]
	Annotations map[string]string `json:"annotations,omitempty"`
	CDIDevices  []string          `json:"cdiDevices,omitempty"`
}

func answerOf(r *api.ContainerAllocateResponse) answer {
	a := answer{Envs: r.Envs, Annotations: r.Annotations}
	for _, d := range r.Devices {
		a.Devices = append(a.Devices, d.HostPath+":"+d.ContainerPath+":"+d.Permissions)
	}
	for _, m := range r.Mounts {
		s := m.HostPath + ":" + m.ContainerPath
		if m.ReadOnly {
			s += ":ro"
		}
		a.Mounts = append(a.Mounts, s)
	}
	for _, d := range r.CdiDevices {
		a.CDIDevices = append(a.CDIDevices, d.Name)
	}
	return a
}

// serve runs `gpu-device-plugin serve` on the node against the kubelet's
// own device-plugin client, and leaves it running for the later steps.
func (c *checker) serve(ctx context.Context, s *Step) {
	if c.listed == nil {
		s.fail("GPUs known", errors.New("the inventory step did not list the GPUs"))
		return
	}
	var want []string
	for _, g := range c.listed.GPUs {
		if g.Resource == harness.ResourceName {
			want = append(want, g.DeviceIDs...)
		}
	}
	if len(want) == 0 {
		s.Skipped = "no GPU is served as " + harness.ResourceName + " (MIG on every GPU)"
		return
	}
	data := &serveData{Resource: harness.ResourceName, Devices: len(want), Answers: map[string]answer{}}
	s.Data = data
	// Before ours starts for the later steps, so that nothing else
	// serves while the two are timed.
	if c.o.compareRuns > 0 {
		data.SideBySide = c.sideBySide(ctx, s, c.o.compareRuns)
		s.Notes = append(s.Notes, data.SideBySide.notes(c.o.compareRuns)...)
	}
	dir := filepath.Join(c.work, "plugins")
	sv := &served{cdiDir: filepath.Join(c.work, "cdi"), allocations: map[string]allocation{}}
	for _, d := range []string{dir, sv.cdiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			s.fail("work folders", err)
			return
		}
	}
	k, err := harness.StartKubelet(dir, klog.Logger{})
	if !s.check("kubelet's registration server starts", err == nil, "%s", errText(err)) {
		return
	}
	sv.kubelet = k
	c.served = sv
	p, err := harness.StartPlugin(harness.PluginOptions{
		Binary:    c.plugin,
		PluginDir: dir,
		Node:      &c.node,
		// CDI names in Allocate's answer, as containerd takes them; the
		// spec and hook are what the container step runs.
		Args: []string{"--cdi-spec-dir", sv.cdiDir, "--cdi-hook-path", c.hook, "--device-list-strategy", "cdi-cri", "--pod-resources-socket", ""},
	})
	if !s.check("plugin starts", err == nil, "%s", errText(err)) {
		return
	}
	sv.plugin = p
	failed := func(name string, err error) {
		s.fail(name, fmt.Errorf("%w; plugin log: %s", err, oneLine(p.Log(), 1500)))
	}

	wait, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	ep, err := k.WaitConnected(wait, harness.ResourceName)
	if err != nil {
		failed("registers", err)
		return
	}
	s.check("registers", true, "")
	first, err := k.WaitDevices(wait, harness.ResourceName, "every GPU", harness.DeviceCount(len(want)))
	if err != nil {
		failed("ListAndWatch lists every GPU", err)
		return
	}
	s.check("ListAndWatch lists every GPU", true, "%d devices", len(want))
	sv.ep = ep
	data.RegisteredMs = harness.Millis(ep.ConnectedAt.Sub(p.Started))
	data.FirstListMs = harness.Millis(first.ReceivedAt.Sub(p.Started))
	healthy := first.Healthy()
	s.check("every GPU healthy", len(healthy) == len(want), "%d of %d healthy", len(healthy), len(want))
	// In index order, so "one" is GPU 0's.
	for _, id := range want {
		if slices.Contains(healthy, id) {
			sv.ids = append(sv.ids, id)
		}
	}
	if len(sv.ids) == 0 {
		return
	}

	sizes := []int{1}
	if n := len(sv.ids); n > 1 {
		sizes = append(sizes, n)
	}
	for _, size := range sizes {
		name := map[bool]string{true: "one", false: "all"}[size == 1]
		ids := sv.ids[:size]
		resp, err := ep.Allocate(wait, ids...)
		if !s.check(fmt.Sprintf("Allocate of %s", name), err == nil, "%s", errText(err)) {
			continue
		}
		data.Answers[name] = answerOf(resp)
		sv.allocations[name] = allocation{ids: ids, resp: resp}
		s.check(fmt.Sprintf("Allocate of %s names a CDI device per GPU", name), len(resp.CdiDevices) >= size,
			"%d CDI devices for %d GPUs", len(resp.CdiDevices), size)
		got, err := ep.GetPreferredAllocation(wait, sv.ids, nil, size)
		s.check(fmt.Sprintf("GetPreferredAllocation of %s", name), err == nil && len(got) == size && subset(got, sv.ids),
			"%v (%s)", got, errText(err))
	}
	for _, size := range sizes {
		l, err := harness.Measure(ctx, c.o.calls, size, waitTimeout, func(ctx context.Context) error {
			_, err := ep.Allocate(ctx, sv.ids[:size]...)
			return err
		})
		if s.check(fmt.Sprintf("timing Allocate of %d", size), err == nil, "%s", errText(err)) {
			data.Allocate = append(data.Allocate, l)
		}
		l, err = harness.Measure(ctx, c.o.calls, size, waitTimeout, func(ctx context.Context) error {
			_, err := ep.GetPreferredAllocation(ctx, sv.ids, nil, size)
			return err
		})
		if s.check(fmt.Sprintf("timing GetPreferredAllocation of %d", size), err == nil, "%s", errText(err)) {
			data.PreferredAllocation = append(data.PreferredAllocation, l)
		}
	}
	if u, err := p.Usage(); err == nil {
		data.PeakRSSMiB = harness.Round(float64(u.PeakRSS)/(1<<20), 1)
	}
}

func subset(ids, of []string) bool {
	for _, id := range ids {
		if !slices.Contains(of, id) {
			return false
		}
	}
	return true
}
