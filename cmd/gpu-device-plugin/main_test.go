package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/urfave/cli/v2"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs/sysfstest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
)

func mockOpen(path string) (nvml.Library, error) { return nvmltest.NewDGXA100(), nil }

func noDriver(path string) (nvml.Library, error) {
	return nil, errors.Join(nvml.ErrNoDriver, errors.New(path+" could not be loaded"))
}

func run(t *testing.T, open func(string) (nvml.Library, error), args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := newApp(open, &stdout, &stderr).RunContext(context.Background(), append([]string{"gpu-device-plugin"}, args...))
	return stdout.String(), stderr.String(), err
}

func TestListJSON(t *testing.T) {
	out, _, err := run(t, mockOpen, "list", "--output", "json", "--sysfs-root", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var l listing
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(l.GPUs) != 8 {
		t.Fatalf("listed %d GPUs, want 8", len(l.GPUs))
	}
	g := l.GPUs[0]
	if g.UUID == "" || g.PCIBusID != nvmltest.GPUAddress(0) || g.Health != "Healthy" || g.MemoryBytes == 0 {
		t.Errorf("first GPU = %+v", g)
	}
}

func TestListShowsHealth(t *testing.T) {
	hot := func(string) (nvml.Library, error) {
		s := nvmltest.NewDGXA100()
		nvmltest.Device(s, 1).GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 92, gonvml.SUCCESS }
		return s, nil
	}
	out, _, err := run(t, hot, "list", "-o", "json", "--sysfs-root", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var l listing
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	if g := l.GPUs[1]; g.Health != "Unhealthy" || g.Reason != "thermal=92C>=slowdown 90C" {
		t.Errorf("hot GPU listed as %s (%s)", g.Health, g.Reason)
	}
	if g := l.GPUs[0]; g.Health != "Healthy" {
		t.Errorf("cool GPU listed as %s (%s)", g.Health, g.Reason)
	}
}

func TestListTable(t *testing.T) {
	out, _, err := run(t, mockOpen, "--sysfs-root", t.TempDir(), "list")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.HasPrefix(lines[0], "INDEX") || len(lines) < 9 || !strings.Contains(lines[1], nvmltest.GPUAddress(0)) {
		t.Fatalf("table:\n%s", out)
	}
}

func TestListWithoutDriverFailsInOneLine(t *testing.T) {
	_, _, err := run(t, noDriver, "list")
	if !errors.Is(err, nvml.ErrNoDriver) || strings.Count(err.Error(), "\n") > 1 {
		t.Fatalf("err = %v", err)
	}
}

func TestSettingsPrecedence(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfgFile, []byte("deviceIDStrategy: index\nlogLevel: warn\nlogFormat: json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GPU_DEVICE_PLUGIN_LOG_LEVEL", "error")
	// The file sets three keys; the environment overrides one, a flag before
	// the command another, a flag after it a third.
	var got string
	app := newApp(mockOpen, &bytes.Buffer{}, &bytes.Buffer{})
	for _, c := range app.Commands {
		if c.Name == "list" {
			c.Action = func(c *cli.Context) error {
				cfg, err := loadConfig(c)
				got = cfg.DeviceIDStrategy + " " + cfg.LogLevel + " " + cfg.LogFormat + " " + cfg.DevRoot
				return err
			}
		}
	}
	err := app.RunContext(context.Background(), []string{"gpu-device-plugin", "--config", cfgFile, "--log-format", "text", "list", "--dev-root", "/host/dev"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "index error text /host/dev"; got != want {
		t.Errorf("settings = %q, want %q", got, want)
	}
}

func TestBadSettingsNameTheField(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{args: []string{"list", "--device-id-strategy", "serial"}, want: "deviceIDStrategy (--device-id-strategy)"},
		{args: []string{"--nvml-retry-interval", "soon", "list"}, want: "--nvml-retry-interval"},
		{args: []string{"list", "--output", "xml"}, want: "--output"},
		{args: []string{"list", "--config", "/nonexistent.yaml"}, want: "/nonexistent.yaml"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, _, err := run(t, mockOpen, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want mention of %q", err, tt.want)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	out, _, err := run(t, noDriver, "version")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gpu-device-plugin dev", "go-nvml:", "driver:  not found"} {
		if !strings.Contains(out, want) {
			t.Errorf("version output lacks %q:\n%s", want, out)
		}
	}
}

func TestCDIGenerate(t *testing.T) {
	out, _, err := run(t, mockOpen, "cdi", "generate", "-o", "-", "--sysfs-root", t.TempDir(), "--driver-root", t.TempDir(), "--dev-root", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Kind    string `json:"kind"`
		Devices []struct {
			Name string `json:"name"`
		} `json:"devices"`
	}
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&spec); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if spec.Kind != cdi.GPUKind || len(spec.Devices) != 16 {
		t.Errorf("spec kind %q with %d devices, want %s with 16 (by UUID and index)", spec.Kind, len(spec.Devices), cdi.GPUKind)
	}

	dir := t.TempDir()
	out, _, err = run(t, mockOpen, "cdi", "generate", "-o", dir, "--sysfs-root", t.TempDir(), "--driver-root", t.TempDir(), "--dev-root", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "gpu-device-plugin_gpu-device-plugin.github.io-gpu.json")); err != nil {
		t.Fatalf("%v; output: %s", err, out)
	}
}

func TestListShowsNICs(t *testing.T) {
	root := sysfstest.Load(t, "dgx-h100")
	out, _, err := run(t, mockOpen, "list", "-o", "json", "--config", "../../internal/config/testdata/example-nics.yaml",
		"--sysfs-root", filepath.Join(root, "sys"), "--proc-root", filepath.Join(root, "proc"), "--dev-root", filepath.Join(root, "dev"))
	if err != nil {
		t.Fatal(err)
	}
	var l listing
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	pooled := map[string]int{}
	for _, n := range l.NICs {
		pooled[n.Pool]++
		if n.Pool != "" && n.Health != "Healthy" {
			t.Errorf("NIC %s in %s is %s (%s)", n.Address, n.Pool, n.Health, n.Reason)
		}
	}
	if pooled["example.com/rdma_numa0"] != 4 || pooled["example.com/rdma_numa1"] != 4 || pooled[""] == 0 {
		t.Errorf("NICs per pool = %v; want 4 and 4 and the management NIC unpooled", pooled)
	}
}

// configOf runs the list command with args and returns the merged
// configuration it would use.
func configOf(t *testing.T, args ...string) (config.Config, error) {
	t.Helper()
	var cfg config.Config
	var err error
	app := newApp(mockOpen, &bytes.Buffer{}, &bytes.Buffer{})
	for _, c := range app.Commands {
		if c.Name == "list" {
			c.Action = func(c *cli.Context) error {
				cfg, err = loadConfig(c)
				return nil
			}
		}
	}
	if runErr := app.RunContext(context.Background(), append([]string{"gpu-device-plugin"}, args...)); runErr != nil {
		t.Fatal(runErr)
	}
	return cfg, err
}

func TestFlagBeatsEnvironmentAtEveryLevel(t *testing.T) {
	t.Setenv("GPU_DEVICE_PLUGIN_DEVICE_ID_STRATEGY", "serial")
	for _, args := range [][]string{
		{"--device-id-strategy=uuid", "list"},
		{"list", "--device-id-strategy=uuid"},
		{"--device-id-strategy=index", "list", "--device-id-strategy=uuid"},
	} {
		cfg, err := configOf(t, args...)
		if err != nil || cfg.DeviceIDStrategy != "uuid" {
			t.Errorf("%v: deviceIDStrategy = %q, %v; want the flag's uuid", args, cfg.DeviceIDStrategy, err)
		}
	}
	// Without a flag the environment is used, and a bad value names it.
	if _, err := configOf(t, "list"); err == nil || !strings.Contains(err.Error(), "deviceIDStrategy") {
		t.Errorf("err = %v, want the environment's bad value refused", err)
	}
}

func TestEmptyEnvironmentIsUnset(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfgFile, []byte("xidIgnore: [13]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GPU_DEVICE_PLUGIN_XID_IGNORE", "")
	t.Setenv("GPU_DEVICE_PLUGIN_DEVICE_LIST_STRATEGY", "")
	t.Setenv("GPU_DEVICE_PLUGIN_CONFIG", cfgFile)
	cfg, err := configOf(t, "list")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.XIDIgnore, []uint64{13}) || !slices.Equal(cfg.DeviceListStrategy, []string{"envvar"}) {
		t.Errorf("xidIgnore = %v, deviceListStrategy = %v; want the file's [13] and the default [envvar]", cfg.XIDIgnore, cfg.DeviceListStrategy)
	}
	t.Setenv("GPU_DEVICE_PLUGIN_CONFIG", "")
	if cfg, err = configOf(t, "list"); err != nil || !slices.Equal(cfg.XIDIgnore, config.Default().XIDIgnore) {
		t.Errorf("empty GPU_DEVICE_PLUGIN_CONFIG: xidIgnore = %v, %v; want the default", cfg.XIDIgnore, err)
	}
}

// list shows each GPU's NVLink domain registration: JSON keys pinned
// here, one line per GPU under the table, nothing for a GPU without one.
func TestListFabric(t *testing.T) {
	uuid := [16]uint8{0x5a, 0x1c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01}
	gb200 := func(string) (nvml.Library, error) {
		s := nvmltest.NewDGXA100()
		nvmltest.WithFabric(s, 0, gonvml.GpuFabricInfo{ClusterUuid: uuid, CliqueId: 3, State: gonvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(gonvml.SUCCESS)}, gonvml.SUCCESS)
		nvmltest.WithFabric(s, 1, gonvml.GpuFabricInfo{State: gonvml.GPU_FABRIC_STATE_IN_PROGRESS, Status: uint32(gonvml.ERROR_NOT_READY)}, gonvml.SUCCESS)
		return s, nil
	}
	out, _, err := run(t, gb200, "list", "-o", "json", "--sysfs-root", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		GPUs []map[string]json.RawMessage `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	want := `{"clique":"5a1c0000-0000-0000-0000-000000000001.3","clusterUUID":"5a1c0000-0000-0000-0000-000000000001","cliqueID":3,"state":"completed","status":"","healthMask":0}`
	compact := func(m json.RawMessage) string {
		var b bytes.Buffer
		if err := json.Compact(&b, m); err != nil {
			return err.Error()
		}
		return b.String()
	}
	if got := compact(raw.GPUs[0]["fabric"]); got != want {
		t.Errorf("GPU 0 fabric:\n%s\nwant\n%s", got, want)
	}
	if got := compact(raw.GPUs[1]["fabric"]); !strings.Contains(got, `"clique":""`) || !strings.Contains(got, `"state":"in-progress"`) {
		t.Errorf("GPU 1 fabric (registering): %s", got)
	}
	if _, ok := raw.GPUs[2]["fabric"]; ok {
		t.Errorf("GPU 2 has no fabric, yet lists one: %s", raw.GPUs[2]["fabric"])
	}
	text, _, err := run(t, gb200, "list", "--sysfs-root", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "GPU 0 fabric: clique 5a1c0000-0000-0000-0000-000000000001.3, cluster 5a1c0000-0000-0000-0000-000000000001, clique ID 3, completed, health mask 0x0\n") ||
		!strings.Contains(text, "GPU 1 fabric: clique none, cluster -, clique ID 0, in-progress") || strings.Contains(text, "GPU 2 fabric") {
		t.Errorf("table:\n%s", text)
	}
}
