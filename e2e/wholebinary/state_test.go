package wholebinary

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

// TestHealthSurvivesRestart: a GPU a fatal XID took out stays out when
// the plugin is SIGKILLed and started again (OOM kill, image update) on
// the same boot; after a reboot (a new boot ID) it is healthy again.
func TestHealthSurvivesRestart(t *testing.T) {
	// The state dir and the boot ID outlive each plugin, as on a node.
	stateDir, proc := t.TempDir(), t.TempDir()
	bootID := filepath.Join(proc, "sys", "kernel", "random", "boot_id")
	if err := os.MkdirAll(filepath.Dir(bootID), 0o755); err != nil {
		t.Fatal(err)
	}
	boot := func(id string) {
		if err := os.WriteFile(bootID, []byte(id+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	boot("8e2b1c1e-0000-4000-8000-000000000001")
	path, err := harness.ProfilePath("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--state-dir", stateDir, "--proc-root", proc}
	n := startNodeWith(t, "dgx-h100", library, args...)
	k, prof := n.k, n.profile
	start := func() *harness.Plugin { return startPlugin(t, library, path, k.Dir(), args...) }
	// firstList is the first device list the kubelet gets after seq.
	firstList := func(seq int) harness.List {
		t.Helper()
		l, err := k.WaitDevices(ctx(t), harness.ResourceName, "a list from the new plugin", func(l harness.List) bool { return l.Seq > seq })
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Devices) != len(prof.GPUs) {
			t.Fatalf("first list has %d GPUs, want %d", len(l.Devices), len(prof.GPUs))
		}
		return l
	}
	restart := func(p *harness.Plugin, seq int) (*harness.Plugin, harness.List) {
		t.Helper()
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		if _, err := k.WaitStats(ctx(t), "the killed plugin disconnected", func(s harness.Stats) bool { return s.Connected == 0 }); err != nil {
			t.Fatal(err)
		}
		p = start()
		return p, firstList(seq)
	}

	sick := prof.GPUs[1].UUID
	p := n.p
	if err := p.Inject("xid 1 79"); err != nil {
		t.Fatal(err)
	}
	l, err := k.WaitDevices(ctx(t), harness.ResourceName, "GPU 1 unhealthy", harness.DeviceHealth(sick, api.Unhealthy))
	if err != nil {
		t.Fatal(err)
	}

	p, l = restart(p, l.Seq)
	for id, d := range l.Devices {
		want := api.Healthy
		if id == sick {
			want = api.Unhealthy
		}
		if d.Health != want {
			t.Errorf("after SIGKILL and restart %s is %s, want %s", id, d.Health, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(stateDir, "health.json")); err != nil || !strings.Contains(string(b), sick) {
		t.Errorf("state file: %v\n%s", err, b)
	}

	boot("8e2b1c1e-0000-4000-8000-000000000002")
	_, l = restart(p, l.Seq)
	if d := l.Devices[sick]; d == nil || d.Health != api.Healthy {
		t.Errorf("after a reboot %s is %v, want Healthy", sick, d)
	}
}
