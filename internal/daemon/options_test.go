package daemon

import (
	"reflect"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

// The health settings reach the watcher's policy field by field, and a
// policy built from settings config accepts is one health accepts.
func TestHealthPolicy(t *testing.T) {
	c := config.Default()
	for k, v := range map[string]string{"xidIgnore": "13", "xidFatal": "79,48", "xidRecoveryPeriod": "0s", "healthPollInterval": "2s", "thermalMarginC": "7"} {
		if err := c.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	p := HealthPolicy(c)
	if !reflect.DeepEqual(p.IgnoredXIDs, []uint64{13}) || !reflect.DeepEqual(p.FatalXIDs, []uint64{79, 48}) ||
		p.XIDRecovery != 0 || p.PollInterval != 2*time.Second || p.ThermalMarginC != 7 || p.RecoveryPolls != 3 {
		t.Fatalf("policy = %+v", p)
	}
	// xids wins over both lists, in both directions.
	c = config.Default()
	if err := c.Set("xids", "74=ignore, 13=fatal,31=transient"); err != nil {
		t.Fatal(err)
	}
	p = HealthPolicy(c)
	for x, want := range map[uint64]policy.XIDAction{74: policy.XIDIgnore, 13: policy.XIDSticky, 31: policy.XIDTransient, 79: policy.XIDSticky, 43: policy.XIDIgnore, 999: policy.XIDTransient} {
		if got := p.XID(x); got != want {
			t.Errorf("xids 74=ignore,13=fatal,31=transient: XID %d = %v, want %v", x, got, want)
		}
	}
	if p := HealthPolicy(config.Default()); p.XIDs != nil {
		t.Errorf("no xids: policy.XIDs = %v, want nil", p.XIDs)
	}
	c = config.Default()
	for k, v := range map[string]string{"healthChecksDisabled": "power-brake,recovery-action", "healthSlowdownSamples": "5", "healthNVMLFailurePolls": "4"} {
		if err := c.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p = HealthPolicy(c)
	if !reflect.DeepEqual(p.Disabled, []string{"power-brake", "recovery-action"}) || p.SlowdownSamples != 5 || p.NVMLFailurePolls != 4 {
		t.Fatalf("policy = %+v", p)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("health refuses the policy config accepted: %v", err)
	}
}

// The sharing sections reach the model entry by entry; NVIDIA's
// failRequestsGreaterThanOne under mps means the default, one share per
// container.
func TestSharingOptions(t *testing.T) {
	c := config.Default()
	c.Sharing.TimeSlicing = config.TimeSlicing{RenameByDefault: true, Placement: config.PlacementPacked, FailRequestsGreaterThanOne: true,
		Resources: []config.SharedResource{{Name: "nvidia.com/gpu", Replicas: 4, Rename: "example.com/ts", Devices: []string{"GPU-1"}}}}
	c.Sharing.MPS = config.MPS{FailRequestsGreaterThanOne: true, Resources: []config.SharedResource{{Name: "nvidia.com/gpu", Replicas: 2}}}
	ts, mps := TimeSlicing(c), MPS(c)
	if n, name := ts.Replicas("nvidia.com/gpu", "GPU-1", ""); n != 4 || name != "example.com/ts" || !ts.RenameByDefault || ts.Placement != config.PlacementPacked || !ts.FailRequestsGreaterThanOne {
		t.Errorf("time-slicing = %+v", ts)
	}
	if n, name := mps.Replicas("nvidia.com/gpu", "GPU-1", ""); n != 2 || name != "nvidia.com/gpu" || mps.SharesPerContainer() != 1 {
		t.Errorf("mps = %+v", mps)
	}
	c.Sharing.MPS.FailRequestsGreaterThanOne, c.Sharing.MPS.MaxSharesPerContainer = false, 2
	if got := MPS(c).SharesPerContainer(); got != 2 {
		t.Errorf("SharesPerContainer() = %d, want 2", got)
	}
}
