//go:build gfdcompare

package gfdcompare

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// GFDVersion is the k8s-device-plugin release whose gpu-feature-discovery
// the labels are compared with (GFD_VERSION overrides it).
const GFDVersion = "v0.19.1"

const gfdModule = "github.com/NVIDIA/k8s-device-plugin"

// onlyGFD are the keys GFD sets and the plugin does not, each with why
// (docs/node-labels.md, "Where we differ from GFD"). Any other key only one
// side sets fails the test.
var onlyGFD = map[string]string{}

// valueDiffers are keys both set whose values may differ, with why. Empty:
// every common key matches on every case.
var valueDiffers = map[string]string{}

// machine is the DMI product name of every mock node, blanks included, so
// that gpu.machine's cleaning is compared too.
const machine = "NVIDIA DGX H100"

type tc struct {
	name, profile string
	migStrategy   string // both sides' --mig-strategy; "" for none
	sharing       string // NVIDIA's v1 config (sharing:), converted with migrate --from for ours
	// want are keys GFD must set on the case, so that a match is not two
	// sides both leaving them out.
	want []string
}

var cases = []tc{
	{name: "dgx-h100", profile: "dgx-h100"},
	{name: "pcie-4gpu", profile: "pcie-4gpu"},
	{name: "pcie-1gpu", profile: "pcie-1gpu"},
	{name: "hgx-16", profile: "hgx-16"},
	{name: "vgpu-1gpu", profile: "vgpu-1gpu", want: []string{"nvidia.com/vgpu.present", "nvidia.com/vgpu.host-driver-version", "nvidia.com/vgpu.host-driver-branch"}},
	{name: "gb200-tray", profile: "gb200-tray", want: []string{"nvidia.com/gpu.clique", "nvidia.com/vgpu.present"}},
	{name: "gb200-split", profile: "gb200-split"},
	{name: "dgx-a100-mig-none", profile: "dgx-a100-mig"},
	{name: "dgx-a100-mig-mixed", profile: "dgx-a100-mig", migStrategy: "mixed"},
	{name: "dgx-a100-mig-single", profile: "dgx-a100-mig", migStrategy: "single"},
	{name: "dgx-h100-mig-none", profile: "dgx-h100-mig"},
	{name: "dgx-h100-mig-mixed", profile: "dgx-h100-mig", migStrategy: "mixed"},
	{name: "dgx-h100-mig-single", profile: "dgx-h100-mig", migStrategy: "single"},
	{name: "dgx-h100-time-slicing", profile: "dgx-h100", sharing: `
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`},
	{name: "dgx-h100-mig-mixed-time-slicing", profile: "dgx-h100-mig", migStrategy: "mixed", sharing: `
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
    - name: nvidia.com/mig-1g.10gb
      replicas: 2
`},
	{name: "dgx-h100-mig-single-time-slicing", profile: "dgx-h100-mig", migStrategy: "single", sharing: `
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`},
	{name: "pcie-4gpu-time-slicing-renamed", profile: "pcie-4gpu", sharing: `
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 3
`},
}

func TestLabelsMatchGFD(t *testing.T) {
	skip := t.Skip
	if os.Getenv("CI") != "" {
		skip = t.Fatal // asked for by name: a skip would pass unseen
	}
	if os.Geteuid() != 0 {
		skip("needs root: GFD runs in a private mount namespace with the mock node's sysfs over /sys")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		skip("needs unshare(1) (util-linux)")
	}
	start := time.Now()
	gfd := buildGFD(t)
	t.Logf("gpu-feature-discovery %s: %s (%.0fs)", gfdVersion(), gfd, time.Since(start).Seconds())
	work := t.TempDir()
	plugin, err := harness.BuildPlugin(filepath.Join(work, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	lib, err := mocknvml.Build(filepath.Join(work, "lib"))
	if err != nil {
		t.Fatal(err)
	}
	var report strings.Builder
	fmt.Fprintf(&report, "GFD %s against %s on the mock nodes\n", gfdVersion(), plugin)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			node := writeNode(t, c.profile)
			var gfdConfig, ourConfig string
			if c.sharing != "" {
				gfdConfig = filepath.Join(node, "nvidia-config.yaml")
				text := "version: v1\n"
				if c.migStrategy != "" {
					text += "flags:\n  migStrategy: " + c.migStrategy + "\n"
				}
				if err := os.WriteFile(gfdConfig, []byte(text+strings.TrimPrefix(c.sharing, "\n")), 0o644); err != nil {
					t.Fatal(err)
				}
				ourConfig = migrate(t, plugin, gfdConfig)
			}
			theirs := runGFD(t, gfd, lib, node, c, gfdConfig)
			ours := runPlugin(t, plugin, lib, node, c, ourConfig)
			for _, k := range c.want {
				if theirs[k] == "" {
					t.Errorf("GFD set no %s here", k)
				}
			}
			common, diffs := compare(theirs, ours)
			for _, d := range diffs {
				t.Error(d)
			}
			fmt.Fprintf(&report, "%s: %d keys both set, %d only GFD's (%s), %d differences\n", c.name, common,
				len(theirs)-common, strings.Join(only(theirs, ours), " "), len(diffs))
			// A GFD that found no GPU, or no sysfs, would "match" little.
			if theirs["nvidia.com/gpu.count"] == "" || theirs["nvidia.com/gpu.mode"] == "unknown" || theirs["nvidia.com/gpu.machine"] == "unknown" {
				t.Errorf("GFD labelled the mock node as without GPUs, sysfs or DMI: %v", theirs)
			}
		})
	}
	t.Log("\n" + report.String())
}

// compare returns how many keys both set, and a line for each value that
// differs on such a key and for each key one side alone sets, except those
// the allow-lists explain.
func compare(theirs, ours map[string]string) (common int, diffs []string) {
	for _, k := range slices.Sorted(maps.Keys(theirs)) {
		v, ok := ours[k]
		switch {
		case !ok && onlyGFD[k] == "":
			diffs = append(diffs, fmt.Sprintf("only GFD sets %s=%s", k, theirs[k]))
		case ok:
			common++
			if v != theirs[k] && valueDiffers[k] == "" {
				diffs = append(diffs, fmt.Sprintf("%s: GFD %q, ours %q", k, theirs[k], v))
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(ours)) {
		if _, ok := theirs[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("only we set %s=%s", k, ours[k]))
		}
	}
	return common, diffs
}

func only(a, b map[string]string) []string {
	var keys []string
	for k := range a {
		if _, ok := b[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// writeNode writes the profile's node: sysfs (with a DMI product name),
// /dev and /proc, under a fresh directory.
func writeNode(t *testing.T, profile string) string {
	t.Helper()
	path, err := harness.ProfilePath(profile)
	if err != nil {
		t.Fatal(err)
	}
	prof, err := mocknvml.LoadProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	node := t.TempDir()
	for dir, write := range map[string]func(string) error{"sys": prof.WriteSysfs, "dev": prof.WriteDev, "proc": prof.WriteProc} {
		if err := write(filepath.Join(node, dir)); err != nil {
			t.Fatal(err)
		}
	}
	dmi := filepath.Join(node, "sys", "class", "dmi", "id")
	if err := os.MkdirAll(dmi, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dmi, "product_name"), []byte(machine+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(path, filepath.Join(node, "node.profile")); err != nil {
		t.Fatal(err)
	}
	return node
}

// runGFD runs GFD once on node and returns its labels. Its NVML is the mock
// library (found as libnvidia-ml.so.1 on LD_LIBRARY_PATH); its sysfs reads
// (PCI class and config space, DMI) go to the node's, bound over /sys in a
// mount namespace of its own.
func runGFD(t *testing.T, gfd, lib, node string, c tc, config string) map[string]string {
	t.Helper()
	out := filepath.Join(node, "gfd.labels")
	args := []string{"--oneshot", "--no-timestamp", "--use-node-feature-api=false", "--output-file", out,
		"--machine-type-file", "/sys/class/dmi/id/product_name", "--fail-on-init-error"}
	if c.migStrategy != "" {
		args = append(args, "--mig-strategy", c.migStrategy)
	}
	if config != "" {
		args = append(args, "--config-file", config)
	}
	script := `mount --bind "$1" /sys && shift && exec "$@"`
	cmd := exec.CommandContext(ctx(t), "unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", script, "sh",
		filepath.Join(node, "sys"), gfd}, args...)...)
	// Only what it needs: GFD reads many settings from the environment.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LD_LIBRARY_PATH=" + filepath.Dir(lib),
		"MOCK_NVML_PROFILE=" + filepath.Join(node, "node.profile")}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gpu-feature-discovery: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			labels[k] = v
		}
	}
	return labels
}

// runPlugin returns the labels of `gpu-device-plugin list -o json` on node.
func runPlugin(t *testing.T, plugin, lib, node string, c tc, config string) map[string]string {
	t.Helper()
	args := []string{"--nvml-library", lib, "--sysfs-root", filepath.Join(node, "sys"), "--dev-root", filepath.Join(node, "dev"),
		"--proc-root", filepath.Join(node, "proc"), "--pod-resources-socket", ""}
	if c.migStrategy != "" {
		args = append(args, "--mig-strategy", c.migStrategy)
	}
	if config != "" {
		args = append(args, "--config", config)
	}
	cmd := exec.CommandContext(ctx(t), plugin, append(args, "list", "-o", "json")...)
	cmd.Env = append(env(), "MOCK_NVML_PROFILE="+filepath.Join(node, "node.profile"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("gpu-device-plugin list: %v\n%s", err, stderr.String())
	}
	var out struct {
		Labels map[string]string `json:"labels"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("list -o json: %v", err)
	}
	return out.Labels
}

// migrate converts NVIDIA's config into the plugin's, as a user would.
func migrate(t *testing.T, plugin, from string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx(t), plugin, "migrate", "--from", from)
	cmd.Env = env()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("migrate --from %s: %v\n%s", from, err, stderr.String())
	}
	path := filepath.Join(filepath.Dir(from), "config.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// env is this environment without the plugin's and the mock's settings.
func env() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPU_DEVICE_PLUGIN_") && !strings.HasPrefix(kv, "MOCK_NVML_") {
			out = append(out, kv)
		}
	}
	return out
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func gfdVersion() string {
	if v := os.Getenv("GFD_VERSION"); v != "" {
		return v
	}
	return GFDVersion
}

// buildGFD builds gpu-feature-discovery from its module once into the
// cluster cache, in a scratch module that requires it, and returns its path.
func buildGFD(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("E2E_CLUSTER_CACHE")
	if cache == "" {
		root, err := harness.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(root, "e2e", "cluster", ".cache")
	}
	version := gfdVersion()
	bin := filepath.Join(cache, "bin", "gfd-"+version, "gpu-feature-discovery")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	src := filepath.Join(cache, "src", "gfd-"+version)
	if err := os.RemoveAll(src); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module e2e-gfdcompare/gfd\n\ngo 1.25\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := bin + ".tmp"
	for _, args := range [][]string{
		{"get", gfdModule + "/cmd/gpu-feature-discovery@" + version},
		{"build", "-trimpath", "-o", tmp, gfdModule + "/cmd/gpu-feature-discovery"},
	} {
		cmd := exec.Command("go", args...)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building gpu-feature-discovery %s: go %s: %v\n%s", version, strings.Join(args, " "), err, b)
		}
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}
