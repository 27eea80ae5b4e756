package wholebinary

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

// listedGPU is what these tests read of one `list -o json` row.
type listedGPU struct {
	Index      int    `json:"index"`
	UUID       string `json:"uuid"`
	NUMANode   int    `json:"numaNode"`
	MIGEnabled bool   `json:"migEnabled"`
	Health     string `json:"health"`
	Reason     string `json:"reason"`
}

// list runs `gpu-device-plugin list -o json` on the profile with lib.
func list(t *testing.T, profile, lib string) []listedGPU {
	t.Helper()
	path, err := harness.ProfilePath(profile)
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := harness.RunCommand(ctx(t), binary, lib, path, "list", "--output", "json", "--log-format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		GPUs []listedGPU `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("list output: %v\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	t.Logf("list stderr:\n%s", stderr)
	return out.GPUs
}

// r470 builds the R470-era mock library for one test.
func r470(t *testing.T) string {
	t.Helper()
	lib, err := harness.BuildMockR470(filepath.Join(t.TempDir(), "r470"))
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

// TestOldDriverList: on an R470-era library, which lacks
// nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetNumaNodeId and
// nvmlDeviceGetTemperatureV, list answers (rather than dying of a symbol
// lookup error) with every GPU Healthy on its sysfs NUMA node.
func TestOldDriverList(t *testing.T) {
	gpus := list(t, "pcie-4gpu", r470(t))
	if len(gpus) != 4 {
		t.Fatalf("listed %d GPUs, want 4: %+v", len(gpus), gpus)
	}
	for _, g := range gpus {
		if g.Health != "Healthy" || g.NUMANode != g.Index/2 {
			t.Errorf("GPU %+v, want Healthy on NUMA node %d", g, g.Index/2)
		}
	}
}

// TestOldDriverServe: the plugin serves on an R470-era library, and the
// fallbacks work: temperature through nvmlDeviceGetTemperature, hardware
// slowdown through nvmlDeviceGetCurrentClocksThrottleReasons.
func TestOldDriverServe(t *testing.T) {
	n := startNodeWith(t, "pcie-4gpu", r470(t))
	onlyUnhealthy(t, n.first)
	if err := n.p.Inject("temp 1 96"); err != nil {
		t.Fatal(err)
	}
	if err := n.p.Inject("throttle 2 0x8"); err != nil { // HW slowdown
		t.Fatal(err)
	}
	l, err := n.k.WaitDevices(ctx(t), harness.ResourceName, "GPUs 1 and 2 unhealthy", func(l harness.List) bool {
		return harness.DeviceHealth(n.uuid(1), api.Unhealthy)(l) && harness.DeviceHealth(n.uuid(2), api.Unhealthy)(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	onlyUnhealthy(t, l, n.uuid(1), n.uuid(2))
	loggedOnce(t, n, n.uuid(1), api.Unhealthy, "thermal=96C")
	loggedOnce(t, n, n.uuid(2), api.Unhealthy, "hw-slowdown")
}

// TestVGPUStaysHealthy: a GPU that answers NOT_SUPPORTED to temperature,
// clock reasons, recovery action and remapped rows is Healthy, and each
// unsupported signal is logged once.
func TestVGPUStaysHealthy(t *testing.T) {
	n := startNode(t, "vgpu-1gpu")
	id := n.uuid(0)
	onlyUnhealthy(t, n.first)
	for _, sig := range []string{"temperature", "clock-reasons", "recovery-action", "remapped-rows"} {
		unsupported := func(e harness.LogEntry) bool { return e.String("device") == id && e.String("signal") == sig }
		if _, err := n.p.WaitLog(ctx(t), "unsupported "+sig, unsupported); err != nil {
			t.Fatal(err)
		}
	}
	// A later event is applied after any earlier poll: an ignored XID
	// round trip shows the plugin still running with the GPU healthy.
	if err := n.p.Inject("xid 0 13"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.p.WaitLog(ctx(t), "the ignored XID", func(e harness.LogEntry) bool { return e.String("xid") == "13" }); err != nil {
		t.Fatal(err)
	}
	if l, ok := n.k.Devices(harness.ResourceName); !ok || l.Devices[id].GetHealth() != api.Healthy {
		t.Errorf("vGPU listed %v, want Healthy", l.Devices[id])
	}
	for _, e := range n.p.LogEntries() {
		if e.String("device") == id && e.String("new") == api.Unhealthy {
			t.Errorf("the vGPU turned unhealthy: %v", e)
		}
	}
}

// TestOneGPUSurvivesTransientError: on a one-GPU node a poll that fails
// every read is logged and changes nothing; the GPU later turns Unhealthy
// for a real reason (heat), never for "nvml: ...".
func TestOneGPUSurvivesTransientError(t *testing.T) {
	n := startNode(t, "pcie-1gpu")
	id := n.uuid(0)
	// Four calls: every read of one poll.
	if err := n.p.Inject("transient 0 4"); err != nil {
		t.Fatal(err)
	}
	failed := func(e harness.LogEntry) bool {
		return e.String("device") == id && strings.Contains(e.String("msg"), "reading GPU health failed")
	}
	if _, err := n.p.WaitLog(ctx(t), "the failed read", failed); err != nil {
		t.Fatal(err)
	}
	if err := n.p.Inject("temp 0 99"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.k.WaitDevices(ctx(t), harness.ResourceName, "GPU 0 hot", harness.DeviceHealth(id, api.Unhealthy)); err != nil {
		t.Fatal(err)
	}
	loggedOnce(t, n, id, api.Unhealthy, "thermal=99C")
	for _, e := range n.p.LogEntries() {
		if strings.HasPrefix(e.String("reason"), "nvml:") {
			t.Errorf("one failed poll was taken for NVML failing: %v", e)
		}
	}
}

// TestRecoveryAction: the driver asking for a reboot takes the GPU out at
// once (through the recovery-action event); none brings it back. A fatal
// XID followed by a reset request and then none clears too, without a
// restart.
func TestRecoveryAction(t *testing.T) {
	// Health's own rules: the remediation, on by default, keeps a GPU the
	// driver wants rebooted out until the reboot (remediation_test.go).
	n := startNodeWith(t, "dgx-h100", library, "--remediation-enabled=false")
	id := n.uuid(2)
	for _, c := range []struct{ cmd, health, reason string }{
		{"recovery 2 reboot", api.Unhealthy, "recovery-action=reboot"},
		{"recovery 2 none", api.Healthy, ""},
	} {
		if err := n.p.Inject(c.cmd); err != nil {
			t.Fatal(err)
		}
		l, err := n.k.WaitDevices(ctx(t), harness.ResourceName, fmt.Sprintf("GPU 2 %s after %q", c.health, c.cmd), harness.DeviceHealth(id, c.health))
		if err != nil {
			t.Fatal(err)
		}
		if c.health == api.Unhealthy {
			onlyUnhealthy(t, l, id)
		} else {
			onlyUnhealthy(t, l)
		}
		loggedOnce(t, n, id, c.health, c.reason)
	}

	sick := n.uuid(5)
	for _, c := range []struct{ cmd, health, reason string }{
		{"xid 5 79", api.Unhealthy, "xid=79"},
		{"recovery 5 reset", api.Unhealthy, "recovery-action=reset, xid=79"},
		{"recovery 5 none", api.Healthy, ""},
	} {
		if err := n.p.Inject(c.cmd); err != nil {
			t.Fatal(err)
		}
		if _, err := n.k.WaitDevices(ctx(t), harness.ResourceName, fmt.Sprintf("GPU 5 %s after %q", c.health, c.cmd), harness.DeviceHealth(sick, c.health)); err != nil {
			t.Fatal(err)
		}
		// The kubelet's list has no reason: the log says the plugin saw it.
		seen := func(e harness.LogEntry) bool { return e.String("device") == sick && e.String("reason") == c.reason }
		if _, err := n.p.WaitLog(ctx(t), fmt.Sprintf("GPU 5 reason %q", c.reason), seen); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.e.Allocate(ctx(t), sick); err != nil {
		t.Errorf("Allocate of the recovered GPU: %v", err)
	}
}

// TestMIGEnabledGPU: list shows the MIG GPU Unhealthy mig-enabled, and
// serve never offers it healthy, not even in the first list.
func TestMIGEnabledGPU(t *testing.T) {
	gpus := list(t, "dgx-a100-mig", library)
	for _, g := range gpus {
		mig := g.Index == 1
		if g.MIGEnabled != mig || (g.Health == "Unhealthy") != mig || (mig && g.Reason != "mig-enabled") {
			t.Errorf("listed %+v", g)
		}
	}
	n := startNode(t, "dgx-a100-mig")
	onlyUnhealthy(t, n.first, n.uuid(1))
	loggedOnce(t, n, n.uuid(1), api.Unhealthy, "mig-enabled")
}

// TestListMIGPartitions: with sharing.migPartitions, list shows what DRA
// mode publishes of a GPU in MIG mode with no instance: every placement
// it allows, consuming its counters, untainted (MIG mode is how it is
// served, not a fault).
func TestListMIGPartitions(t *testing.T) {
	path, err := harness.ProfilePath("dgx-h100-mig")
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("kubeletAPI: dra\nnodeName: gpu-node\nsharing:\n  migPartitions: {enabled: true, devices: [\"2\"]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := harness.RunCommand(ctx(t), binary, library, path, "list", "--config", cfg, "--output", "json", "--log-format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		DRA struct {
			Devices []struct {
				Name             string `json:"name"`
				Taints           []any  `json:"taints"`
				ConsumesCounters []struct {
					CounterSet string           `json:"counterSet"`
					Counters   map[string]int64 `json:"counters"`
				} `json:"consumesCounters"`
			} `json:"devices"`
		} `json:"dra"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("list output: %v\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	placements := 0
	for _, d := range out.DRA.Devices {
		if !strings.HasPrefix(d.Name, "gpu-2-") {
			continue
		}
		placements++
		if len(d.Taints) > 0 || len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != "gpu-2-slices" {
			t.Errorf("%s: taints %v, counters %+v", d.Name, d.Taints, d.ConsumesCounters)
		}
		if d.Name == "gpu-2-3g-40gb-4" && (d.ConsumesCounters[0].Counters["compute-slices"] != 3 || d.ConsumesCounters[0].Counters["memory-slice-7"] != 1) {
			t.Errorf("%s counters %v", d.Name, d.ConsumesCounters[0].Counters)
		}
	}
	if placements != 25 {
		t.Errorf("%d placements of GPU 2 listed, want an H100's 25\n%s", placements, stdout)
	}
}
