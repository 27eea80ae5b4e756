package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	prt "github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources/podresourcestest"
)

// MIG device memory of an A100 40GB as NVML's attributes give it.
const (
	a100MiB1g = 4864
	a100MiB3g = 19968
)

// uuidOf is the fixed UUID of GPU i of migNode.
func uuidOf(i int) string { return fmt.Sprintf("GPU-00000000-0000-0000-0000-00000000000%d", i) }

// The MIG devices of migNode: on GPU 0 two 1g.5gb and one 3g.20gb, on
// GPU 1 one 1g.5gb; GPUs 2-7 have MIG off.
const (
	mig0a = "MIG-00000000-0000-0000-0000-0000000000a0" // GPU 0, MIG index 0, gi 7
	mig0b = "MIG-00000000-0000-0000-0000-0000000000b0" // GPU 0, MIG index 1, gi 8
	mig0c = "MIG-00000000-0000-0000-0000-0000000000c0" // GPU 0, MIG index 2, gi 2, 3g.20gb
	mig1a = "MIG-00000000-0000-0000-0000-0000000000a1" // GPU 1, MIG index 0, gi 7
)

// migNode is the mock DGX A100 with fixed UUIDs and the MIG devices
// above; hot makes GPU 0 too hot. It returns the open function and a
// procfs root with the devices' access capabilities (GPU 0's gi7 is
// minors 66 and 67).
func migNode(t *testing.T, hot bool) (func(string) (nvml.Library, error), string) {
	t.Helper()
	proc := t.TempDir()
	caps := map[string]int{
		"gpu0/mig/gi7/access": 66, "gpu0/mig/gi7/ci0/access": 67,
		"gpu0/mig/gi8/access": 75, "gpu0/mig/gi8/ci0/access": 76,
		"gpu0/mig/gi2/access": 21, "gpu0/mig/gi2/ci0/access": 22,
		"gpu1/mig/gi7/access": 201, "gpu1/mig/gi7/ci0/access": 202,
	}
	for rel, minor := range caps {
		p := filepath.Join(proc, "driver/nvidia/capabilities", rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, fmt.Appendf(nil, "DeviceFileMinor: %d\nDeviceFileMode: 292\n", minor), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	open := func(string) (nvml.Library, error) {
		s := nvmltest.NewDGXA100()
		for i := range s.Devices {
			nvmltest.Device(s, i).UUID = uuidOf(i)
		}
		oneG := func(uuid string, gi int) *nvmltest.MIG {
			return &nvmltest.MIG{UUID: uuid, GPUInstance: gi, GISlices: 1, MemoryMiB: a100MiB1g, Multiprocessors: 14, GIProfile: gonvml.GPU_INSTANCE_PROFILE_1_SLICE}
		}
		nvmltest.WithMIG(s, 0, oneG(mig0a, 7), oneG(mig0b, 8),
			&nvmltest.MIG{UUID: mig0c, GPUInstance: 2, GISlices: 3, MemoryMiB: a100MiB3g, Multiprocessors: 42, GIProfile: gonvml.GPU_INSTANCE_PROFILE_3_SLICE})
		nvmltest.WithMIG(s, 1, oneG(mig1a, 7))
		if hot {
			nvmltest.Device(s, 0).GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 92, gonvml.SUCCESS }
		}
		return s, nil
	}
	return open, proc
}

// configFile writes a config file and returns its path.
func configFile(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// runMIG runs a command on migNode with config file cfg ("" for none).
func runMIG(t *testing.T, hot bool, cfg string, args ...string) (string, string, error) {
	t.Helper()
	open, proc := migNode(t, hot)
	// --node-name before the command: allocate does not take it, and the
	// top level takes every setting.
	args = append(append([]string{"--node-name", "node-1"}, args...), "--proc-root", proc, "--sysfs-root", t.TempDir(), "--dev-root", t.TempDir())
	if cfg != "" {
		args = append(args, "--config", configFile(t, cfg))
	}
	return run(t, open, args...)
}

// listMIG lists migNode as JSON, decoding strictly: a key the listing
// types lack fails.
func listMIG(t *testing.T, hot bool, cfg string, args ...string) listing {
	t.Helper()
	out, stderr, err := runMIG(t, hot, cfg, append([]string{"list", "-o", "json"}, args...)...)
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	var l listing
	if err := dec.Decode(&l); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return l
}

// Under mixed, each MIG device is listed under its GPU with its profile
// and the nvidia.com/mig-<profile> resource it is served as; its GPU is
// not served whole. Holders through the device-plugin API and DRA (by
// the MIG device's DRA name) are merged.
func TestListMIGMixed(t *testing.T) {
	kubelet := prt.Start(t,
		prt.Pod("ml", "a", prt.Container("x", prt.Devices("nvidia.com/mig-1g.5gb", mig0b))),
		prt.Pod("ml", "b", prt.ClaimContainer("y", prt.Claim("ml", "c", "gpu-device-plugin.github.io", "node-1", "gpu-0-mig-8-0"))),
		// The same ID under another resource is not this device's.
		prt.Pod("ml", "c", prt.Container("z", prt.Devices("nvidia.com/gpu", mig0a))),
	)
	l := listMIG(t, false, "migStrategy: mixed\n", "--pod-resources-socket", kubelet.Socket)
	g0 := l.GPUs[0]
	if !g0.MIGEnabled || g0.Resource != "" || len(g0.DeviceIDs) != 0 || g0.Health != "Healthy" {
		t.Errorf("GPU 0 = %+v; want MIG enabled, not served whole, healthy", g0)
	}
	want := []listedMIG{
		{UUID: mig0a, Index: 0, GPUInstance: 7, Profile: "1g.5gb", MemoryBytes: a100MiB1g << 20, Multiprocessors: 14, CapMinors: []int{66, 67},
			Health: "Healthy", Resource: "nvidia.com/mig-1g.5gb", DeviceIDs: []string{mig0a}, AllocatedTo: []listedHolder{}},
		{UUID: mig0b, Index: 1, GPUInstance: 8, Profile: "1g.5gb", MemoryBytes: a100MiB1g << 20, Multiprocessors: 14, CapMinors: []int{75, 76},
			Health: "Healthy", Resource: "nvidia.com/mig-1g.5gb", DeviceIDs: []string{mig0b}, AllocatedTo: []listedHolder{{"ml", "a", "x"}, {"ml", "b", "y"}}},
		{UUID: mig0c, Index: 2, GPUInstance: 2, Profile: "3g.20gb", MemoryBytes: a100MiB3g << 20, Multiprocessors: 42, CapMinors: []int{21, 22},
			Health: "Healthy", Resource: "nvidia.com/mig-3g.20gb", DeviceIDs: []string{mig0c}, AllocatedTo: []listedHolder{}},
	}
	if len(g0.MIG) != len(want) {
		t.Fatalf("GPU 0 MIG devices = %+v, want %d", g0.MIG, len(want))
	}
	for i := range want {
		if got := fmt.Sprintf("%+v", g0.MIG[i]); got != fmt.Sprintf("%+v", want[i]) {
			t.Errorf("MIG device %d =\n  %s\nwant\n  %+v", i, got, want[i])
		}
	}
	if g2 := l.GPUs[2]; g2.Resource != "nvidia.com/gpu" || !slices.Equal(g2.DeviceIDs, []string{uuidOf(2)}) || len(g2.MIG) != 0 {
		t.Errorf("GPU 2 = %+v; want served whole as nvidia.com/gpu", g2)
	}

	out, _, err := runMIG(t, false, "migStrategy: mixed\n", "list", "--pod-resources-socket", kubelet.Socket)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out, "\n")
	if !strings.Contains(lines[0], "HEALTH") || !strings.Contains(lines[0], "RESOURCE") || !strings.Contains(lines[0], "REPLICAS") || !strings.HasSuffix(strings.TrimSpace(lines[0]), "HOLDER") {
		t.Errorf("header %q", lines[0])
	}
	row := func(prefix string) string {
		for _, line := range lines {
			if strings.HasPrefix(line, prefix) {
				return line
			}
		}
		t.Errorf("no row %q in\n%s", prefix, out)
		return ""
	}
	if r := row("  0:1 "); !strings.Contains(r, mig0b) || !strings.Contains(r, "1g.5gb") || !strings.Contains(r, "nvidia.com/mig-1g.5gb") || !strings.HasSuffix(r, "ml/a/x,ml/b/y") {
		t.Errorf("MIG row %q", r)
	}
	if r := row("0 "); !strings.Contains(r, uuidOf(0)) || strings.Contains(r, "nvidia.com") {
		t.Errorf("GPU 0 row %q: want no resource", r)
	}
}

// TestListMIGKeys: every key of a MIG device is lowerCamelCase and
// present, empty lists as [].
func TestListMIGKeys(t *testing.T) {
	out, _, err := runMIG(t, false, "", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		GPUs []struct {
			MIG []map[string]any `json:"mig"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	want := []string{"allocatedTo", "capMinors", "computeInstance", "deviceIDs", "gpuInstance", "health", "index", "memoryBytes", "multiprocessors", "profile", "reason", "resource", "sharing", "uuid"}
	for _, m := range l.GPUs[0].MIG {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, want) {
			t.Errorf("MIG keys %v, want %v", keys, want)
		}
	}
	if !strings.Contains(out, `"mig": []`) || strings.Contains(out, "null") {
		t.Errorf("a GPU without MIG devices does not list mig as [], or a key is null:\n%s", out)
	}
}

// Under none, a MIG GPU is served whole and Unhealthy (mig-enabled), as
// serve reports it; its MIG devices are not served but show their own
// health, which is what DRA publishes them with.
func TestListMIGNone(t *testing.T) {
	l := listMIG(t, false, "")
	g0 := l.GPUs[0]
	if g0.Resource != "nvidia.com/gpu" || g0.Health != "Unhealthy" || g0.Reason != "mig-enabled" {
		t.Errorf("GPU 0 = %s %q as %q; want Unhealthy mig-enabled as nvidia.com/gpu", g0.Health, g0.Reason, g0.Resource)
	}
	for _, m := range g0.MIG {
		if m.Resource != "" || len(m.DeviceIDs) != 0 || m.Health != "Healthy" {
			t.Errorf("MIG device %s = %+v; want healthy, not served", m.UUID, m)
		}
	}
	for _, d := range l.DRA.Devices {
		if len(d.Taints) != 0 {
			t.Errorf("DRA device %s tainted %+v", d.Name, d.Taints)
		}
	}
}

// Under single, the MIG devices of the node's most common profile are
// served as nvidia.com/gpu; the others are listed with no resource.
func TestListMIGSingle(t *testing.T) {
	l := listMIG(t, false, "migStrategy: single\n")
	for _, g := range l.GPUs[:2] {
		for _, m := range g.MIG {
			want := "nvidia.com/gpu"
			if m.Profile != "1g.5gb" {
				want = ""
			}
			if m.Resource != want || (want == "") != (len(m.DeviceIDs) == 0) {
				t.Errorf("MIG device %s (%s) served as %q %v, want %q", m.UUID, m.Profile, m.Resource, m.DeviceIDs, want)
			}
		}
	}
	if g := l.GPUs[2]; g.Resource != "" {
		t.Errorf("GPU 2 (MIG off) served as %q under single", g.Resource)
	}
}

// A hot GPU makes its MIG devices Unhealthy with its reason, and the DRA
// preview taints their devices with it.
func TestListMIGHealth(t *testing.T) {
	l := listMIG(t, true, "migStrategy: mixed\n")
	const reason = "thermal=92C>=slowdown 90C"
	for _, m := range l.GPUs[0].MIG {
		if m.Health != "Unhealthy" || m.Reason != reason {
			t.Errorf("MIG device %s = %s (%s), want Unhealthy (%s)", m.UUID, m.Health, m.Reason, reason)
		}
	}
	if m := l.GPUs[1].MIG[0]; m.Health != "Healthy" {
		t.Errorf("MIG device of the cool GPU 1 = %s (%s)", m.Health, m.Reason)
	}
	tainted := map[string]bool{}
	for _, d := range l.DRA.Devices {
		if len(d.Taints) > 0 {
			tainted[d.Name] = true
		}
	}
	want := map[string]bool{"gpu-0-mig-7-0": true, "gpu-0-mig-8-0": true, "gpu-0-mig-2-0": true}
	if fmt.Sprint(tainted) != fmt.Sprint(want) {
		t.Errorf("tainted DRA devices %v, want %v", tainted, want)
	}
}

// fourReplicas shares every whole GPU as 4 replicas under its own name.
const fourReplicas = `
migStrategy: mixed
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
`

// With time-slicing, a GPU lists its replica IDs and the REPLICAS column
// their count; a holder of any replica is the GPU's.
func TestListReplicas(t *testing.T) {
	kubelet := prt.Start(t,
		prt.Pod("ml", "a", prt.Container("x", prt.Devices("nvidia.com/gpu", uuidOf(3)+"::1"))),
		prt.Pod("ml", "b", prt.Container("y", prt.Devices("nvidia.com/gpu", uuidOf(3)+"::3"))),
	)
	l := listMIG(t, false, fourReplicas, "--pod-resources-socket", kubelet.Socket)
	g := l.GPUs[3]
	want := []string{uuidOf(3) + "::0", uuidOf(3) + "::1", uuidOf(3) + "::2", uuidOf(3) + "::3"}
	if g.Resource != "nvidia.com/gpu" || !slices.Equal(g.DeviceIDs, want) {
		t.Errorf("GPU 3 served as %q %v, want nvidia.com/gpu %v", g.Resource, g.DeviceIDs, want)
	}
	if !slices.Equal(g.AllocatedTo, []listedHolder{{"ml", "a", "x"}, {"ml", "b", "y"}}) {
		t.Errorf("GPU 3 allocatedTo = %v", g.AllocatedTo)
	}
	// MIG devices have no entry: not shared.
	if m := l.GPUs[0].MIG[0]; !slices.Equal(m.DeviceIDs, []string{mig0a}) {
		t.Errorf("MIG device IDs %v", m.DeviceIDs)
	}

	out, _, err := runMIG(t, false, fourReplicas, "list", "--pod-resources-socket", kubelet.Socket)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "3" && !strings.Contains(strings.Join(f, " "), " nvidia.com/gpu 4 ml/a/x,ml/b/y") {
			t.Errorf("GPU 3 row lacks its resource and 4 replicas: %q", line)
		}
	}
}

// allocateMIG runs allocate on migNode as JSON.
func allocateMIG(t *testing.T, cfg string, args ...string) allocation {
	t.Helper()
	out, stderr, err := runMIG(t, false, cfg, append([]string{"allocate", "-o", "json"}, args...)...)
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	var a allocation
	if err := json.Unmarshal([]byte(out), &a); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return a
}

func pickIDs(a allocation) (ids, units []string) {
	for _, p := range a.Picks {
		ids, units = append(ids, p.ID), append(units, p.Unit)
	}
	return ids, units
}

// Distributed placement spreads two replicas over two GPUs, the best
// linked pair of the least used (GPUs 2 and 3, which share a PCIe switch
// and NVLink; 0 and 1 are in MIG mode); packed puts both on one GPU, and
// fills the most used first.
func TestAllocateReplicas(t *testing.T) {
	a := allocateMIG(t, fourReplicas, "--size", "2")
	ids, units := pickIDs(a)
	if !slices.Equal(ids, []string{uuidOf(2) + "::0", uuidOf(3) + "::0"}) || !slices.Equal(units, []string{"2", "3"}) {
		t.Errorf("distributed picks %v on %v, want replica 0 of GPUs 2 and 3", ids, units)
	}
	for _, p := range a.Picks {
		if !strings.HasPrefix(p.Why, "distributed: ") {
			t.Errorf("pick %+v: why does not say distributed", p)
		}
	}
	if a.Placement != "distributed" || a.Resource != "nvidia.com/gpu" || a.Available != 24 || len(a.GPUs) != 2 || len(a.Pairs) != 1 {
		t.Errorf("allocation %+v", a)
	}

	packed := strings.Replace(fourReplicas, "    resources:", "    placement: packed\n    resources:", 1)
	a = allocateMIG(t, packed, "--size", "2")
	if ids, units := pickIDs(a); !slices.Equal(ids, []string{uuidOf(2) + "::0", uuidOf(2) + "::1"}) || !slices.Equal(units, []string{"2", "2"}) {
		t.Errorf("packed picks %v on %v, want replicas 0 and 1 of GPU 2", ids, units)
	}
	if a.Placement != "packed" || len(a.GPUs) != 1 || !strings.HasPrefix(a.Picks[0].Why, "packed: ") {
		t.Errorf("allocation %+v", a)
	}
	// GPU 5 has one replica held (not available): packed fills it first.
	a = allocateMIG(t, packed, "--size", "2", "--available", uuidOf(4)+","+uuidOf(5)+"::0,"+uuidOf(5)+"::2,"+uuidOf(5)+"::3")
	if ids, _ := pickIDs(a); !slices.Equal(ids, []string{uuidOf(5) + "::0", uuidOf(5) + "::2"}) {
		t.Errorf("packed picks %v, want replicas 0 and 2 of the used GPU 5", ids)
	}
	if a.Available != 7 {
		t.Errorf("available %d, want GPU 4's 4 replicas and 3 of GPU 5", a.Available)
	}

	out, _, err := runMIG(t, false, fourReplicas, "allocate", "--size", "2")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"DEVICE ID", "UNIT", "WHY", uuidOf(2) + "::0  2 ", "2 of 24 available devices of nvidia.com/gpu", "placement distributed"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// A MIG resource is answered with picks too, units named <gpu>:<mig>.
func TestAllocateMIG(t *testing.T) {
	a := allocateMIG(t, "migStrategy: mixed\n", "--resource", "nvidia.com/mig-1g.5gb", "--size", "2")
	ids, units := pickIDs(a)
	// MIG devices have no NVLink peer access: two of one GPU outrank two
	// on NVLinked GPUs.
	if !slices.Equal(ids, []string{mig0a, mig0b}) || !slices.Equal(units, []string{"0:0", "0:1"}) {
		t.Errorf("picks %v on %v", ids, units)
	}
	if a.Placement != "" || !a.Exact || a.Available != 3 || len(a.Pairs) != 1 || a.Pairs[0].A != 0 || a.Pairs[0].B != 0 || a.Pairs[0].NVLinks != 0 {
		t.Errorf("allocation %+v", a)
	}
	a = allocateMIG(t, "migStrategy: mixed\n", "--resource", "nvidia.com/mig-1g.5gb", "--size", "1", "--available", "0:1,1:0", "--must-include", "1:0")
	if ids, _ := pickIDs(a); !slices.Equal(ids, []string{mig1a}) || a.Picks[0].Why != "must include" {
		t.Errorf("picks %+v", a.Picks)
	}
}

func TestAllocateResourceRefused(t *testing.T) {
	tests := []struct {
		name, cfg string
		args      []string
		want      []string
	}{
		{name: "unknown resource", cfg: "migStrategy: mixed\n", args: []string{"--resource", "nvidia.com/mig-7g.40gb"},
			want: []string{`--resource: "nvidia.com/mig-7g.40gb" is not served`, "served: nvidia.com/gpu, nvidia.com/mig-1g.5gb, nvidia.com/mig-3g.20gb"}},
		{name: "must-include a shared GPU", cfg: fourReplicas, args: []string{"--must-include", "3"},
			want: []string{`--must-include: "3" is GPU 3, shared as 4 replicas`, uuidOf(3) + "::0 to " + uuidOf(3) + "::3"}},
		{name: "an ID of another resource", cfg: "migStrategy: mixed\n", args: []string{"--available", mig0a},
			want: []string{`--available: "` + mig0a + `" is neither`, "nvidia.com/gpu"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := runMIG(t, false, tt.cfg, append([]string{"allocate", "--size", "1"}, tt.args...)...)
			for _, want := range tt.want {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("err = %v, want it to say %q", err, want)
				}
			}
		})
	}
}

// On whole unshared GPUs the answer is the allocator's, as before: no
// picks, resource or placement keys.
func TestAllocateWholeKeepsItsKeys(t *testing.T) {
	out, _, err := runAllocate(t, "--size", "2", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &keys); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range keys {
		got = append(got, k)
	}
	slices.Sort(got)
	if want := []string{"available", "exact", "gpus", "pairs", "score", "size"}; !slices.Equal(got, want) {
		t.Errorf("keys %v, want %v", got, want)
	}
	if bytes.Contains([]byte(out), []byte("picks")) {
		t.Errorf("picks in %s", out)
	}
}
