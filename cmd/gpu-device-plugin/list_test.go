package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	prt "github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources/podresourcestest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs/sysfstest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/state"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.* from what list prints now")

// linkDown takes the link of 0000:40:00.0 (pool rdma_numa0) down, its
// InfiniBand port and its IPoIB netdev ibp64s0 both, so the golden listing
// shows an unhealthy NIC with its reason.
const linkDown = `
file sys/devices/pci0000:00/0000:40:00.0/net/ibp64s0/operstate down
file sys/devices/pci0000:00/0000:40:00.0/net/ibp64s0/carrier 0
file sys/devices/pci0000:00/0000:40:00.0/infiniband/mlx5_1/ports/1/state 1: DOWN
file sys/devices/pci0000:00/0000:40:00.0/infiniband/mlx5_1/ports/1/phys_state 3: Disabled
`

// goldenHolders is the kubelet of the golden node: one container holds
// GPU 0 and the NIC 0000:18:00.0; the entries after it must match nothing
// (another resource with a GPU's UUID as ID, another driver's DRA device
// with one of our names).
func goldenHolders(t *testing.T) *prt.Server {
	return prt.Start(t,
		prt.Pod("ml", "trainer-0", prt.Container("main",
			prt.Devices("nvidia.com/gpu", "GPU-00000000-0000-0000-0000-000000000000"),
			prt.Devices("example.com/rdma_numa0", "0000:18:00.0"))),
		prt.Pod("other", "job", prt.Container("c", prt.Devices("example.com/other", "GPU-00000000-0000-0000-0000-000000000001"))),
		prt.Pod("other", "claim", prt.ClaimContainer("c", prt.Claim("other", "c", "example.com", "golden-node", "gpu-2"))),
	)
}

// TestListGolden pins `list` and `list -o json` on a fixed node: the mock
// DGX A100 with fixed UUIDs and GPU 1 too hot, the dgx-h100 sysfs tree
// with one link down, the example NIC pools, and a kubelet whose one pod
// holds a GPU and a NIC. The JSON keys are an
// interface scripts read; a change to the golden JSON must be on purpose
// and go into docs/cli.md. Refresh with `go test ./cmd/gpu-device-plugin -run
// TestListGolden -update`.
func TestListGolden(t *testing.T) {
	root := sysfstest.Load(t, "dgx-h100")
	sysfstest.Apply(t, root, linkDown)
	open := func(string) (nvml.Library, error) {
		s := nvmltest.NewDGXA100()
		for i := range s.Devices {
			nvmltest.Device(s, i).UUID = fmt.Sprintf("GPU-00000000-0000-0000-0000-00000000000%d", i)
		}
		nvmltest.Device(s, 1).GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 92, gonvml.SUCCESS }
		return s, nil
	}
	kubelet := goldenHolders(t)
	// Its container runtime opens every GPU to NVIDIA_VISIBLE_DEVICES.
	runtimeRoot, err := filepath.Abs(filepath.Join("testdata", "runtime-root"))
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", "../../internal/config/testdata/example-nics.yaml", "--node-name", "golden-node", "--pod-resources-socket", kubelet.Socket,
		"--sysfs-root", filepath.Join(root, "sys"), "--proc-root", filepath.Join(root, "proc"), "--dev-root", filepath.Join(root, "dev"),
		"--cdi-hook-path", "/nonexistent/gpu-device-plugin-cdi-hook", "--runtime-config-root", runtimeRoot,
		// Entries that name no GPU, one of them part of the model name.
		"--exclude-gpus", "GPU-typo,A100"}

	tests := []struct {
		name, golden string
		args         []string
		// normalize turns stdout into what is compared.
		normalize func(t *testing.T, out string) []byte
	}{
		{name: "table", golden: "list.golden.txt", args: []string{"list", "--dra"},
			normalize: func(_ *testing.T, out string) []byte { return []byte(out) }},
		{name: "json", golden: "list.golden.json", args: []string{"list", "-o", "json"}, normalize: withoutPCINames},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, stderr, err := run(t, open, append(tt.args, args...)...)
			if err != nil {
				t.Fatalf("%v\nstderr:\n%s", err, stderr)
			}
			if strings.Contains(stderr, "PodResources API") {
				t.Errorf("the fake kubelet was not read:\n%s", stderr)
			}
			got := tt.normalize(t, out)
			path := filepath.Join("testdata", tt.golden)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("list output differs from %s (if the change is meant, run with -update and update docs/cli.md):\n--- got\n%s\n--- want\n%s", path, got, want)
			}
		})
	}
}

// TestListTableDRAOnRequest: a device-plugin node's table leaves out what
// DRA mode would publish, unless asked (--dra) or in DRA mode.
func TestListTableDRAOnRequest(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"list"}, false},
		{[]string{"list", "--dra"}, true},
		{[]string{"list", "--kubelet-api", "dra"}, true},
	} {
		out, _, err := run(t, mockOpen, append(tc.args, "--sysfs-root", t.TempDir(), "--node-name", "n")...)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(out, "DRA DEVICE"); got != tc.want {
			t.Errorf("%v: DRA table shown %v, want %v:\n%s", tc.args, got, tc.want, out)
		}
	}
}

// list says whether the CDI hook is installed, and in the table, when CDI
// is in use, what its absence breaks.
func TestListCDIHook(t *testing.T) {
	hook := filepath.Join(t.TempDir(), "gpu-device-plugin-cdi-hook")
	args := []string{"--sysfs-root", t.TempDir(), "--cdi-hook-path", hook, "--device-list-strategy", "cdi-cri"}
	out, _, err := run(t, mockOpen, append([]string{"list"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "CDI hook: NOT INSTALLED") || !strings.Contains(out, "CUDA fails at its first call") {
		t.Errorf("table does not say the hook is missing:\n%s", out)
	}
	if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, _, err = run(t, mockOpen, append([]string{"list", "-o", "json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var l listing
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	if want := (listedHook{Path: hook, Installed: true, InUse: true}); l.CDIHook != want {
		t.Errorf("cdiHook = %+v, want %+v", l.CDIHook, want)
	}
}

// list says whether the container runtime opens every GPU to
// NVIDIA_VISIBLE_DEVICES, in the table and the JSON, for each state.
func TestListRuntimeDoor(t *testing.T) {
	const containerd = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = \"nvidia\"\n" +
		"[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\nBinaryName = \"/usr/bin/nvidia-container-runtime\"\n"
	tests := []struct {
		name      string
		files     map[string]string // under the root; nil: runtimeConfigRoot empty
		wantState string
		wantOpen  bool
		wantLine  string
	}{
		{name: "open", files: map[string]string{"etc/containerd/config.toml": containerd},
			wantState: "open", wantOpen: true, wantLine: "NVIDIA_VISIBLE_DEVICES: OPEN"},
		{name: "closed by the toolkit", files: map[string]string{"etc/containerd/config.toml": containerd,
			"etc/nvidia-container-runtime/config.toml": "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"},
			wantState: "closed", wantLine: "NVIDIA_VISIBLE_DEVICES: closed to pods that ask for no GPU (envvarRefused)"},
		{name: "unknown", files: map[string]string{"etc/containerd/config.toml": "[plugins\n"},
			wantState: "unknown", wantLine: "NVIDIA_VISIBLE_DEVICES: UNKNOWN"},
		{name: "unchecked", files: nil, wantState: "unchecked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := ""
			if tt.files != nil {
				root = t.TempDir()
				for p, content := range tt.files {
					if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			args := []string{"--sysfs-root", t.TempDir(), "--runtime-config-root=" + root}
			table, _, err := run(t, mockOpen, append([]string{"list"}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantLine != "" && !strings.Contains(table, tt.wantLine) || tt.wantLine == "" && strings.Contains(table, "NVIDIA_VISIBLE_DEVICES") {
				t.Errorf("table, want %q:\n%s", tt.wantLine, table)
			}
			out, _, err := run(t, mockOpen, append([]string{"list", "-o", "json"}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			var l listing
			if err := json.Unmarshal([]byte(out), &l); err != nil {
				t.Fatal(err)
			}
			if d := l.RuntimeDoor; d.State != tt.wantState || d.Open != tt.wantOpen || (d.Fix != "") != (tt.wantState == "open" || tt.wantState == "unknown") {
				t.Errorf("runtimeDoor = %+v, want state %s", d, tt.wantState)
			}
		})
	}
}

// withoutPCINames blanks vendorName and deviceName: they come from the
// machine's own pci.ids (list has no setting to point it elsewhere), so
// they differ between machines. The keys stay. It decodes strictly, so a
// key list prints that listing lacks fails here.
func withoutPCINames(t *testing.T, out string) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(out)))
	dec.DisallowUnknownFields()
	var l listing
	if err := dec.Decode(&l); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for i := range l.NICs {
		l.NICs[i].VendorName, l.NICs[i].DeviceName = "", ""
	}
	var b bytes.Buffer
	if err := writeJSON(&b, l); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestListJSONKeysAreLowerCamelCase: every key of every GPU and NIC, and
// of the listing itself, starts with a lower-case letter, even on a node
// with nothing to report.
func TestListJSONKeysAreLowerCamelCase(t *testing.T) {
	root := sysfstest.Load(t, "dgx-h100")
	out, _, err := run(t, mockOpen, "list", "-o", "json", "--config", "../../internal/config/testdata/example-nics.yaml",
		"--sysfs-root", filepath.Join(root, "sys"), "--proc-root", filepath.Join(root, "proc"), "--dev-root", filepath.Join(root, "dev"))
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		GPUs []map[string]any `json:"gpus"`
		NICs []map[string]any `json:"nics"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	if len(l.GPUs) == 0 || len(l.NICs) == 0 {
		t.Fatalf("listed %d GPUs and %d NICs, want some of each", len(l.GPUs), len(l.NICs))
	}
	var top map[string]any
	if err := json.Unmarshal([]byte(out), &top); err != nil {
		t.Fatal(err)
	}
	objects := append([]map[string]any{top}, append(l.GPUs, l.NICs...)...)
	for _, o := range objects {
		for k := range o {
			if k == "" || k[0] < 'a' || k[0] > 'z' || strings.ContainsAny(k, "_- ") {
				t.Errorf("key %q is not lowerCamelCase", k)
			}
		}
	}
	// The unpooled management NIC has every key too, empty.
	for _, n := range l.NICs {
		if len(n) != len(l.NICs[0]) {
			t.Errorf("NIC %v has %d keys, NIC %v has %d: every key must always be present", n["address"], len(n), l.NICs[0]["address"], len(l.NICs[0]))
		}
	}
}

// fixedUUIDs is the mock DGX A100 with GPU i's UUID ending in i.
func fixedUUIDs(string) (nvml.Library, error) {
	s := nvmltest.NewDGXA100()
	for i := range s.Devices {
		nvmltest.Device(s, i).UUID = fmt.Sprintf("GPU-00000000-0000-0000-0000-00000000000%d", i)
	}
	return s, nil
}

// listOn lists the dgx-h100 tree with the example pools, node "node-1",
// asking the kubelet at socket.
func listOn(t *testing.T, socket string, args ...string) (stdout, stderr string) {
	t.Helper()
	root := sysfstest.Load(t, "dgx-h100")
	stdout, stderr, err := run(t, fixedUUIDs, append(append([]string{"list"}, args...), "--config", "../../internal/config/testdata/example-nics.yaml",
		"--node-name", "node-1", "--pod-resources-socket", socket,
		"--sysfs-root", filepath.Join(root, "sys"), "--proc-root", filepath.Join(root, "proc"), "--dev-root", filepath.Join(root, "dev"))...)
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	return stdout, stderr
}

// Devices prepared through DRA are matched by driver, pool (the node)
// and device name; a device held by several containers lists them all,
// and one held both ways lists each container once.
func TestListHolders(t *testing.T) {
	const driver = "gpu-device-plugin.github.io"
	const uuid3 = "GPU-00000000-0000-0000-0000-000000000003"
	kubelet := prt.Start(t,
		prt.Pod("ml", "a", prt.ClaimContainer("x", prt.Claim("ml", "gpus", driver, "node-1", "gpu-3", "nic-0000-9a-00-0"))),
		prt.Pod("ml", "a", prt.ClaimContainer("y", prt.Claim("ml", "gpus", driver, "node-1", "gpu-3"))),
		prt.Pod("ml", "b", prt.Container("z", prt.Devices("nvidia.com/gpu", uuid3))),
		prt.Pod("ml", "a", prt.Container("x", prt.Devices("nvidia.com/gpu", uuid3))),
		// Another node's pool.
		prt.Pod("ml", "c", prt.ClaimContainer("w", prt.Claim("ml", "gpus", driver, "node-2", "gpu-4"))),
	)
	out, stderr := listOn(t, kubelet.Socket, "-o", "json")
	if strings.Contains(stderr, "PodResources API") {
		t.Errorf("the fake kubelet was not read:\n%s", stderr)
	}
	var l listing
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	want := []listedHolder{{"ml", "a", "x"}, {"ml", "a", "y"}, {"ml", "b", "z"}}
	if got := l.GPUs[3].AllocatedTo; !slices.Equal(got, want) {
		t.Errorf("GPU 3 allocatedTo = %v, want %v", got, want)
	}
	for i, g := range l.GPUs {
		if i != 3 && len(g.AllocatedTo) != 0 {
			t.Errorf("GPU %d allocatedTo = %v, want none", i, g.AllocatedTo)
		}
	}
	for _, n := range l.NICs {
		want := []listedHolder{}
		if n.Address == "0000:9a:00.0" {
			want = []listedHolder{{"ml", "a", "x"}}
		}
		if !slices.Equal(n.AllocatedTo, want) {
			t.Errorf("NIC %s allocatedTo = %v, want %v", n.Address, n.AllocatedTo, want)
		}
	}
	table, _ := listOn(t, kubelet.Socket)
	if !strings.Contains(table, "ml/a/x,ml/a/y,ml/b/z\n") {
		t.Errorf("the table does not list GPU 3's holders comma-separated:\n%s", table)
	}
}

// Without a kubelet to ask, list lists everything but holders, and says
// so once, naming the socket and the setting.
func TestListWithoutPodResources(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	out, stderr := listOn(t, socket, "-o", "json")
	if notes := podResourcesNotes(stderr); len(notes) != 1 || !strings.Contains(notes[0], socket) || !strings.Contains(notes[0], "podResourcesSocket (--pod-resources-socket)") {
		t.Errorf("not one note naming %s and the setting: %q", socket, notes)
	}
	if !strings.Contains(out, `"allocatedTo": []`) || strings.Contains(out, `"allocatedTo": null`) {
		t.Errorf("allocatedTo is not an empty list:\n%s", out)
	}
	table, _ := listOn(t, socket)
	for _, line := range strings.Split(strings.TrimSpace(table), "\n")[1:9] {
		if !strings.HasSuffix(line, "  -") {
			t.Errorf("GPU row with a holder, or none shown as -: %q", line)
		}
	}
}

// A kubelet that answers with an error is said once too, with its error.
func TestListPodResourcesError(t *testing.T) {
	kubelet := prt.Start(t)
	kubelet.Fail(status.Error(codes.PermissionDenied, "not allowed"))
	_, stderr := listOn(t, kubelet.Socket)
	if notes := podResourcesNotes(stderr); len(notes) != 1 || !strings.Contains(notes[0], "not allowed") || !strings.Contains(notes[0], "podResourcesSocket") {
		t.Errorf("not one note with the kubelet's error: %q", notes)
	}
}

// podResourcesNotes are the log lines about the PodResources API.
func podResourcesNotes(stderr string) []string {
	var out []string
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, "PodResources API") {
			out = append(out, line)
		}
	}
	return out
}

// openNamed is the mock DGX A100 with UUIDs GPU-rem-0 to GPU-rem-7.
func openNamed(string) (nvml.Library, error) {
	s := nvmltest.NewDGXA100()
	for i := range s.Devices {
		nvmltest.Device(s, i).UUID = fmt.Sprintf("GPU-rem-%d", i)
	}
	return s, nil
}

// list shows each GPU's remediation as the running plugin saved it, read
// as the plugin reads it: only this boot's file, only with remediation
// on. A GPU with nothing to say has no "remediation" key, and the table
// gets its REMEDIATION column and lines only while one is under way.
func TestListRemediation(t *testing.T) {
	stateDir, procRoot := t.TempDir(), t.TempDir()
	bootID := filepath.Join(procRoot, "sys", "kernel", "random", "boot_id")
	setBoot := func(id string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(bootID), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bootID, []byte(id+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setBoot("boot-1")
	now := time.Now()
	saved := remedy.Saved{GPUs: []remedy.SavedGPU{
		{UUID: "GPU-rem-0", State: remedy.StateNeedsHuman, Decision: remedy.DecisionHuman, Reason: "the reset failed: not supported",
			Since: time.Date(2026, 11, 27, 6, 1, 0, 0, time.UTC), Resets: []time.Time{now.Add(-time.Hour)}},
		{UUID: "GPU-rem-1", State: remedy.StateServing, Resets: []time.Time{now.Add(-time.Hour)}},
		{UUID: "GPU-rem-2", State: remedy.StateServing, Resets: []time.Time{now.Add(-30 * time.Hour)}},
	}}
	if err := (state.Store{Path: filepath.Join(stateDir, "remediation.json"), BootIDPath: bootID}).Save(saved); err != nil {
		t.Fatal(err)
	}
	args := []string{"--sysfs-root", t.TempDir(), "--proc-root", procRoot, "--state-dir", stateDir, "--pod-resources-socket", "", "--node-name", "n"}
	list := func(t *testing.T, extra ...string) (listing, string) {
		t.Helper()
		out, stderr, err := run(t, openNamed, append(append([]string{"list", "-o", "json"}, args...), extra...)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		var l listing
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatal(err)
		}
		table, stderr, err := run(t, openNamed, append(append([]string{"list"}, args...), extra...)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		return l, table
	}
	remediationOf := func(l listing, i int) string {
		if l.GPUs[i].Remediation == nil {
			return ""
		}
		b, _ := json.Marshal(l.GPUs[i].Remediation)
		return string(b)
	}

	t.Run("on, this boot's file", func(t *testing.T) {
		l, table := list(t, "--remediation-enabled", "true")
		if got, want := remediationOf(l, 0), `{"state":"needsHuman","decision":"human","reason":"the reset failed: not supported","since":"2026-11-27T06:01:00Z","resets":1,"heldFor":""}`; got != want {
			t.Errorf("GPU 0's remediation\n%s\nwant\n%s", got, want)
		}
		if got, want := remediationOf(l, 1), `{"state":"serving","decision":"","reason":"","since":"","resets":1,"heldFor":""}`; got != want {
			t.Errorf("GPU 1, serving with a reset in the window:\n%s\nwant\n%s", got, want)
		}
		for i := 2; i < len(l.GPUs); i++ {
			if got := remediationOf(l, i); got != "" {
				t.Errorf("GPU %d has nothing to say, yet %s", i, got)
			}
		}
		header, _, _ := strings.Cut(table, "\n")
		if !strings.Contains(header, "HEALTH") || !strings.Contains(header, "REMEDIATION") {
			t.Errorf("no REMEDIATION column:\n%s", table)
		}
		if !strings.Contains(table, "GPU 0 remediation: needsHuman since 2026-11-27T06:01:00Z (decision human, 1 reset(s) in the window): the reset failed: not supported; once fixed, give it back: gpu-device-plugin remediation release GPU-rem-0\n") {
			t.Errorf("no line for GPU 0:\n%s", table)
		}
		if strings.Contains(table, "GPU 1 remediation") {
			t.Errorf("a line for a serving GPU:\n%s", table)
		}
	})
	for _, tc := range []struct {
		name  string
		boot  string
		extra []string
	}{
		{"off: the plugin does not act on the file", "boot-1", []string{"--remediation-enabled=false"}},
		{"another boot's file", "boot-2", []string{"--remediation-enabled", "true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setBoot(tc.boot)
			l, table := list(t, tc.extra...)
			for i := range l.GPUs {
				if got := remediationOf(l, i); got != "" {
					t.Errorf("GPU %d: %s", i, got)
				}
			}
			if strings.Contains(table, "REMEDIATION") || strings.Contains(table, "remediation") {
				t.Errorf("the table shows a remediation:\n%s", table)
			}
		})
	}
}
