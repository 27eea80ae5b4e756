package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
	"sigs.k8s.io/yaml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// nvidiaFile is a config file as NVIDIA's Helm chart users write it.
const nvidiaFile = `version: v1
flags:
  migStrategy: mixed
  failOnInitError: true
  nvidiaDriverRoot: /run/nvidia/driver
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [cdi-cri]
    deviceIDStrategy: uuid
    containerDriverRoot: /driver-root
  gfd:
    oneshot: false
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
    - name: nvidia.com/mig-1g.10gb
      replicas: 2
`

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMigrate: migrate prints a config our loader takes, and one stderr
// line per NVIDIA setting left behind, naming it.
func TestMigrate(t *testing.T) {
	from := writeFile(t, "nvidia.yaml", nvidiaFile)
	out, stderr, err := run(t, mockOpen, "migrate", "--from", from)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	p := writeFile(t, "config.yaml", out)
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatalf("config.Load of migrate's output: %v\n%s", err, out)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("migrate's output does not validate: %v\n%s", err, out)
	}
	if cfg.MIGStrategy != "mixed" || cfg.DriverRoot != "/driver-root" || cfg.HostDriverRoot != "/run/nvidia/driver" ||
		len(cfg.Sharing.TimeSlicing.Resources) != 2 || !cfg.Sharing.TimeSlicing.RenameByDefault {
		t.Errorf("converted config = %+v\n%s", cfg, out)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i, want := range []string{"flags.failOnInitError", "flags.plugin.passDeviceSpecs", "flags.gfd.oneshot"} {
		if i >= len(lines) || !strings.HasPrefix(lines[i], "migrate: "+want+": ") {
			t.Errorf("stderr line %d should name %s:\n%s", i, want, stderr)
		}
	}
	if len(lines) != 3 {
		t.Errorf("stderr has %d lines, want 3:\n%s", len(lines), stderr)
	}
}

func TestMigrateValuesAndEnv(t *testing.T) {
	t.Setenv("MIG_STRATEGY", "single")
	t.Setenv("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver")
	t.Setenv("DEVICE_LIST_STRATEGY", "envvar,cdi-cri")
	out, stderr, err := run(t, mockOpen, "migrate", "--env", "-o", "values")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var values struct {
		Config             map[string]any `json:"config"`
		DeviceListStrategy []string       `json:"deviceListStrategy"`
		DriverRoot         string         `json:"driverRoot"`
	}
	if err := yaml.UnmarshalStrict([]byte(out), &values); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if values.Config["migStrategy"] != "single" || values.DriverRoot != "/run/nvidia/driver" || strings.Join(values.DeviceListStrategy, ",") != "envvar,cdi-cri" {
		t.Errorf("values:\n%s", out)
	}
	if stderr != "" {
		t.Errorf("stderr = %q, want nothing: every variable carried over", stderr)
	}
}

func TestMigrateMistakes(t *testing.T) {
	refused := writeFile(t, "refused.yaml", "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2, rename: nvidia.com/gpu}\n")
	for _, tc := range []struct {
		name string
		args []string
		code int // exit status; 0: any error
		want string
	}{
		{"nothing to read", []string{"migrate"}, 2, "give --from FILE"},
		{"bad output", []string{"migrate", "--env", "-o", "json"}, 2, `--output: "json" is not allowed; use config or values`},
		{"missing file", []string{"migrate", "--from", "/nonexistent/nvidia.yaml"}, 0, "/nonexistent/nvidia.yaml"},
		{"our own format", []string{"migrate", "--from", writeFile(t, "ours.yaml", "migStrategy: mixed\n")}, 0, "gpu-device-plugin's format already"},
		{"a value we refuse", []string{"migrate", "--from", refused}, 0, `sharing.timeSlicing.resources[0].rename: "nvidia.com/gpu" is the entry's own name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := run(t, mockOpen, tc.args...)
			var exit cli.ExitCoder
			if err == nil || !strings.Contains(err.Error(), tc.want) || tc.code != 0 && (!errors.As(err, &exit) || exit.ExitCode() != tc.code) {
				t.Errorf("err = %v, want one saying %q (exit %d)", err, tc.want, tc.code)
			}
		})
	}
}

// TestNVIDIAEnvWarnsOnce: NVIDIA's variables left in the environment get
// one warning naming each and our counterpart, and are not applied.
func TestNVIDIAEnvWarnsOnce(t *testing.T) {
	t.Setenv("MIG_STRATEGY", "mixed")
	t.Setenv("PASS_DEVICE_SPECS", "true")
	t.Setenv("FAIL_ON_INIT_ERROR", "") // empty: unset
	// Applied, this value would fail validation.
	t.Setenv("DEVICE_ID_STRATEGY", "serial")
	for _, args := range [][]string{
		{"list", "--sysfs-root", t.TempDir()},
		{"version"},
	} {
		_, stderr, err := run(t, mockOpen, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, stderr)
		}
		if n := strings.Count(stderr, "NVIDIA k8s-device-plugin environment variables are set; they are not applied"); n != 1 {
			t.Errorf("%v: %d warnings, want 1:\n%s", args, n, stderr)
		}
		for _, want := range []string{"MIG_STRATEGY → migStrategy (--mig-strategy, GPU_DEVICE_PLUGIN_MIG_STRATEGY)", "PASS_DEVICE_SPECS → none", "DEVICE_ID_STRATEGY → deviceIDStrategy"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("%v: the warning should say %q:\n%s", args, want, stderr)
			}
		}
		if strings.Contains(stderr, "FAIL_ON_INIT_ERROR") {
			t.Errorf("%v: an empty variable is warned about:\n%s", args, stderr)
		}
	}
}

func TestMigrateComputeDomains(t *testing.T) {
	in := "apiVersion: resource.nvidia.com/v1beta1\nkind: ComputeDomain\nmetadata:\n  name: job\nspec:\n  numNodes: 2\n  channel:\n    resourceClaimTemplate:\n      name: job-channel\n"
	f := writeFile(t, "cd.yaml", in)
	out, stderr, err := run(t, mockOpen, "migrate", "--compute-domains", f)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if want := strings.Replace(in, "resource.nvidia.com/v1beta1", "gpu-device-plugin.github.io/v1alpha1", 1); out != want {
		t.Errorf("got:\n%s", out)
	}
	if !strings.Contains(stderr, "1 ComputeDomain(s) rewritten") {
		t.Errorf("stderr: %q", stderr)
	}
	if _, _, err := run(t, mockOpen, "migrate", "--compute-domains", f, "--from", f); err == nil || !strings.Contains(err.Error(), "apart from --from") {
		t.Errorf("with --from: %v", err)
	}
}
