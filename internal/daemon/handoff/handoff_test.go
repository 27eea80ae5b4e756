package handoff

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// What gpu-device-plugin serve passes is read back to the same
// configuration, NIC pools, MIG strategy, sharing and durations included,
// by either executable.
func TestReadRoundTrip(t *testing.T) {
	for _, api := range []string{config.KubeletAPIDevicePlugin, config.KubeletAPIDRA} {
		t.Run(api, func(t *testing.T) {
			cfg, err := config.Load("../../config/testdata/example-nics.yaml")
			if err != nil {
				t.Fatal(err)
			}
			cfg.KubeletAPI, cfg.NodeName, cfg.PodUID, cfg.Kubeconfig = api, "node-a", "uid-1", "/etc/kubernetes/kubelet.conf"
			cfg.XIDIgnore = []uint64{13}
			cfg.XIDRecoveryPeriod = config.Duration{Duration: 90 * time.Second}
			shared, err := config.Load("../../config/testdata/example-sharing.yaml")
			if err != nil {
				t.Fatal(err)
			}
			cfg.MIGStrategy, cfg.Sharing = shared.MIGStrategy, shared.Sharing
			js, err := json.Marshal(cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Read([]string{Flag, string(js)}, api)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, cfg) {
				t.Errorf("round trip changed the configuration:\n got %+v\nwant %+v", got, cfg)
			}
		})
	}
}

func TestReadRefusals(t *testing.T) {
	dp, err := json.Marshal(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, api string
		args      []string
		want      string
	}{
		{"run by hand", config.KubeletAPIDRA, nil, "gpu-device-plugin serve --kubelet-api=dra"},
		{"run by hand, device plugin", config.KubeletAPIDevicePlugin, []string{"--help"}, "gpu-device-plugin serve --kubelet-api=device-plugin"},
		{"not JSON", config.KubeletAPIDRA, []string{Flag, "{"}, Flag},
		{"the other mode", config.KubeletAPIDRA, []string{Flag, string(dp)}, `kubeletAPI is "device-plugin"`},
		{"invalid setting", config.KubeletAPIDRA, []string{Flag, `{"kubeletAPI":"dra","logLevel":"loud"}`}, "logLevel"},
		{"invalid setting, device plugin", config.KubeletAPIDevicePlugin, []string{Flag, `{"kubeletAPI":"device-plugin","migStrategy":"some"}`}, "migStrategy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Read(tc.args, tc.api); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one with %q", err, tc.want)
			}
		})
	}
}

func TestExecutable(t *testing.T) {
	if got := Executable(config.KubeletAPIDRA); got != DRA {
		t.Errorf("dra: %s", got)
	}
	if got := Executable(config.KubeletAPIDevicePlugin); got != DevicePlugin {
		t.Errorf("device-plugin: %s", got)
	}
}

// Find looks on $PATH only when asked: serve must not run some other
// gpu-device-plugin-dp a test binary or a lone copy finds there.
func TestFindOnPath(t *testing.T) {
	dir := t.TempDir()
	const name = "gpu-device-plugin-handoff-test"
	if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	if _, err := Find(name, false); !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "not beside this executable") {
		t.Errorf("beside only: err = %v, want ErrNotInstalled", err)
	}
	if p, err := Find(name, true); err != nil || p != filepath.Join(dir, name) {
		t.Errorf("on $PATH: %q, %v", p, err)
	}
	if _, err := Find(name+"-absent", true); !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "$PATH") {
		t.Errorf("absent: err = %v, want ErrNotInstalled naming $PATH", err)
	}
}
