package draslice

import (
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
)

func TestTaintsOf(t *testing.T) {
	for reason, want := range map[string]string{
		"xid=79":                                "d/xid=79",
		"gpu-lost":                              "d/gpu-lost=",
		"hw-slowdown+hw-power-brake":            "d/hw-slowdown=;d/hw-power-brake=",
		"nvml: ERROR_UNKNOWN: bad, mig-enabled": "d/nvml=ERROR_UNKNOWN-bad;d/mig-enabled=",
		"RDMA port down: mlx5_1/1":              "d/rdma-port-down=mlx5_1-1",
		"recovery-action=reset, xid=48":         "d/recovery-action=reset;d/xid=48",
		"xid=1, xid=2":                          "d/xid=1",
	} {
		var got []string
		for _, tt := range TaintsOf("d", reason) {
			got = append(got, tt.Key+"="+tt.Value)
		}
		if strings.Join(got, ";") != want {
			t.Errorf("taintsOf(%q) = %v, want %s", reason, got, want)
		}
	}
}

func TestSemver(t *testing.T) {
	for in, want := range map[string]string{"535.104.05": "535.104.5", "9.0": "9.0.0", "550": "550.0.0", "": "", "1.2.3.4": "", "r550": ""} {
		if got := Semver(in); got != want {
			t.Errorf("Semver(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDeviceNames(t *testing.T) {
	if got := NICDeviceName("0000:3B:00.1"); got != "nic-0000-3b-00-1" {
		t.Errorf("NICDeviceName = %q", got)
	}
	if got := GPUDeviceName(nvml.GPU{Index: 7}); got != "gpu-7" {
		t.Errorf("GPUDeviceName = %q", got)
	}
}

func TestStampKeepsTimes(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 10, 0, 0, 700, time.UTC)
	first := Stamp(TaintsOf("d", "xid=79"), nil, t0)
	if len(first) != 1 || !first[0].TimeAdded.Equal(t0.Truncate(time.Second)) || first[0].Effect != EffectNoSchedule {
		t.Fatalf("first = %+v", first)
	}
	next := Stamp(TaintsOf("d", "xid=79, gpu-lost"), first, t0.Add(time.Hour))
	if !next[0].TimeAdded.Equal(*first[0].TimeAdded) || !next[1].TimeAdded.Equal(t0.Add(time.Hour).Truncate(time.Second)) {
		t.Errorf("next = %+v", next)
	}
	if Stamp(nil, next, t0) != nil {
		t.Error("no conditions, but taints")
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[uint64]string{80 << 30: "80Gi", 40960 << 20: "40Gi", 1536 << 20: "1536Mi", 1000: "1000", 0: "0"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
