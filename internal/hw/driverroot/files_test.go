package driverroot

import (
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/cditest"

	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fileLines renders files as "container <- host" with the root replaced
// by $ROOT, one per line, for readable comparisons.
func fileLines(root string, fs []File) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		host := strings.Replace(f.HostPath, root, "$ROOT", 1)
		out[i] = f.Path + " <- " + host
	}
	return out
}

func TestFind(t *testing.T) {
	const x86 = "/usr/lib/x86_64-linux-gnu/"
	lib := func(container, host string) string { return x86 + container + " <- $ROOT" + x86 + host }
	tests := []struct {
		name     string
		manifest string
		goarch   string
		version  string
		libs     []string
		bins     []string
		firmware []string
	}{
		{
			name:     "ubuntu host after an upgrade mounts the running version only",
			manifest: cditest.Manifest(t),
			goarch:   "amd64",
			version:  "550.54.15",
			libs: []string{
				lib("libnvidia-ml.so.550.54.15", "libnvidia-ml.so.550.54.15"),
				lib("libnvidia-ml.so.1", "libnvidia-ml.so.550.54.15"),
				lib("libnvidia-cfg.so.550.54.15", "libnvidia-cfg.so.550.54.15"),
				lib("libnvidia-cfg.so.1", "libnvidia-cfg.so.550.54.15"),
				lib("libcuda.so.550.54.15", "libcuda.so.550.54.15"),
				lib("libcuda.so.1", "libcuda.so.550.54.15"),
				lib("libcudadebugger.so.550.54.15", "libcudadebugger.so.550.54.15"),
				lib("libcudadebugger.so.1", "libcudadebugger.so.550.54.15"),
				lib("libnvidia-ptxjitcompiler.so.550.54.15", "libnvidia-ptxjitcompiler.so.550.54.15"),
				lib("libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so.550.54.15"),
				lib("libnvidia-nvvm.so.550.54.15", "libnvidia-nvvm.so.550.54.15"),
				lib("libnvidia-nvvm.so.4", "libnvidia-nvvm.so.550.54.15"),
				lib("libnvidia-gpucomp.so.550.54.15", "libnvidia-gpucomp.so.550.54.15"),
				lib("libnvidia-opencl.so.550.54.15", "libnvidia-opencl.so.550.54.15"),
				lib("libnvidia-opencl.so.1", "libnvidia-opencl.so.550.54.15"),
				lib("libnvidia-allocator.so.550.54.15", "libnvidia-allocator.so.550.54.15"),
				lib("libnvidia-allocator.so.1", "libnvidia-allocator.so.550.54.15"),
				lib("libnvidia-pkcs11.so.550.54.15", "libnvidia-pkcs11.so.550.54.15"),
				lib("libnvidia-pkcs11-openssl3.so.550.54.15", "libnvidia-pkcs11-openssl3.so.550.54.15"),
				lib("libnvcuvid.so.550.54.15", "libnvcuvid.so.550.54.15"),
				lib("libnvcuvid.so.1", "libnvcuvid.so.550.54.15"),
				lib("libnvidia-encode.so.550.54.15", "libnvidia-encode.so.550.54.15"),
				lib("libnvidia-encode.so.1", "libnvidia-encode.so.550.54.15"),
			},
			bins: []string{
				"/usr/bin/nvidia-smi <- $ROOT/usr/bin/nvidia-smi",
				"/usr/bin/nvidia-debugdump <- $ROOT/usr/bin/nvidia-debugdump",
				"/usr/bin/nvidia-persistenced <- $ROOT/usr/lib/nvidia/bin/nvidia-persistenced",
				"/usr/bin/nvidia-cuda-mps-control <- $ROOT/usr/bin/nvidia-cuda-mps-control",
				"/usr/bin/nvidia-cuda-mps-server <- $ROOT/usr/bin/nvidia-cuda-mps-server",
			},
			firmware: []string{"/lib/firmware/nvidia/550.54.15 <- $ROOT/usr/lib/firmware/nvidia/550.54.15"},
		},
		{
			name: "aarch64 driver container with absolute links and no firmware",
			manifest: `
file usr/lib/aarch64-linux-gnu/libnvidia-ml.so.570.86.15
link usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1 /usr/lib/aarch64-linux-gnu/libnvidia-ml.so.570.86.15
file usr/lib/aarch64-linux-gnu/libcuda.so.570.86.15
link usr/lib/aarch64-linux-gnu/libcuda.so.1 /usr/lib/aarch64-linux-gnu/libcuda.so.570.86.15
file usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15
file bin/nvidia-smi
`,
			goarch:  "arm64",
			version: "570.86.15",
			libs: []string{
				"/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.570.86.15 <- $ROOT/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.570.86.15",
				"/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1 <- $ROOT/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.570.86.15",
				"/usr/lib/aarch64-linux-gnu/libcuda.so.570.86.15 <- $ROOT/usr/lib/aarch64-linux-gnu/libcuda.so.570.86.15",
				"/usr/lib/aarch64-linux-gnu/libcuda.so.1 <- $ROOT/usr/lib/aarch64-linux-gnu/libcuda.so.570.86.15",
			},
			bins: []string{"/bin/nvidia-smi <- $ROOT/bin/nvidia-smi"},
		},
		{
			name: "rhel lib64 layout: a soname link to an older file still gets the running version",
			manifest: `
file usr/lib64/libnvidia-ml.so.550.54.15
link usr/lib64/libnvidia-ml.so.1 libnvidia-ml.so.550.54.15
file usr/lib64/libcuda.so.550.54.15
file usr/lib64/libcuda.so.535.129.03
link usr/lib64/libcuda.so.1 libcuda.so.535.129.03
`,
			goarch:  "amd64",
			version: "550.54.15",
			libs: []string{
				"/usr/lib64/libnvidia-ml.so.550.54.15 <- $ROOT/usr/lib64/libnvidia-ml.so.550.54.15",
				"/usr/lib64/libnvidia-ml.so.1 <- $ROOT/usr/lib64/libnvidia-ml.so.550.54.15",
				"/usr/lib64/libcuda.so.550.54.15 <- $ROOT/usr/lib64/libcuda.so.550.54.15",
				"/usr/lib64/libcuda.so.1 <- $ROOT/usr/lib64/libcuda.so.550.54.15",
			},
		},
		{
			name: "unversioned NVML file leaves the version unknown and picks soname targets",
			manifest: `
file usr/lib/libnvidia-ml.so.1
file usr/lib/libcuda.so.550.54.15
file usr/lib/libcuda.so.545.23.08
link usr/lib/libcuda.so.1 libcuda.so.545.23.08
file usr/lib/libnvidia-opencl.so.550.54.15
file usr/lib/libnvidia-opencl.so.545.23.08
dir  lib/firmware/nvidia/550.54.15
`,
			goarch: "amd64",
			libs: []string{
				"/usr/lib/libnvidia-ml.so.1 <- $ROOT/usr/lib/libnvidia-ml.so.1",
				"/usr/lib/libcuda.so.545.23.08 <- $ROOT/usr/lib/libcuda.so.545.23.08",
				"/usr/lib/libcuda.so.1 <- $ROOT/usr/lib/libcuda.so.545.23.08",
				"/usr/lib/libnvidia-opencl.so.550.54.15 <- $ROOT/usr/lib/libnvidia-opencl.so.550.54.15",
			},
		},
		{
			name: "links that climb out of the root stay inside it",
			manifest: `
file usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15
link usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 ../../../../../../usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15
`,
			goarch:  "amd64",
			version: "550.54.15",
			libs: []string{
				x86 + "libnvidia-ml.so.550.54.15 <- $ROOT" + x86 + "libnvidia-ml.so.550.54.15",
				x86 + "libnvidia-ml.so.1 <- $ROOT" + x86 + "libnvidia-ml.so.550.54.15",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root, _ := cditest.Tree(t, tt.manifest)
			d, err := FindArch(root, tt.goarch)
			if err != nil {
				t.Fatal(err)
			}
			if d.Root != root || d.Version != tt.version {
				t.Errorf("root %q version %q, want %q %q", d.Root, d.Version, root, tt.version)
			}
			for _, c := range []struct {
				what      string
				got, want []string
			}{
				{"libraries", fileLines(root, d.Libraries), tt.libs},
				{"binaries", fileLines(root, d.Binaries), tt.bins},
				{"firmware", fileLines(root, d.Firmware), tt.firmware},
			} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("%s:\n got  %s\n want %s", c.what, strings.Join(c.got, "\n      "), strings.Join(c.want, "\n      "))
				}
			}
			if got := len(d.All()); got != len(d.Libraries)+len(d.Binaries)+len(d.Firmware) {
				t.Errorf("All() has %d files", got)
			}
		})
	}
}

func TestFindWithoutNVML(t *testing.T) {
	t.Run("empty root says which directories were searched", func(t *testing.T) {
		root, _ := cditest.Tree(t, "file usr/bin/nvidia-smi\nfile usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15\n")
		d, err := FindArch(root, "amd64")
		if !errors.Is(err, ErrNoDriver) {
			t.Fatalf("error %v, want ErrNoDriver", err)
		}
		if !strings.Contains(err.Error(), "usr/lib/x86_64-linux-gnu") || d.Root != root || len(d.All()) != 0 {
			t.Errorf("error %q, driver %+v", err, d)
		}
	})
	t.Run("dangling soname link is no library", func(t *testing.T) {
		root, _ := cditest.Tree(t, "link usr/lib64/libnvidia-ml.so.1 libnvidia-ml.so.550.54.15\n")
		if _, err := FindArch(root, "amd64"); !errors.Is(err, ErrNoDriver) {
			t.Fatalf("error %v, want ErrNoDriver", err)
		}
	})
	t.Run("missing root", func(t *testing.T) {
		_, err := Find(filepath.Join(t.TempDir(), "nope"))
		if err == nil || errors.Is(err, ErrNoDriver) {
			t.Fatalf("error %v, want a plain not-found", err)
		}
	})
}

func TestCompareVersions(t *testing.T) {
	sorted := []string{"1", "4", "10", "535.129.03", "535.129.3.1", "545.23.08", "550.54.15", "550.127.05"}
	got := slices.SortedFunc(slices.Values([]string{"550.127.05", "4", "535.129.3.1", "10", "550.54.15", "1", "545.23.08", "535.129.03"}), compareVersions)
	if !slices.Equal(got, sorted) {
		t.Errorf("got %v, want %v", got, sorted)
	}
}

func TestRebase(t *testing.T) {
	d := Files{Root: "/driver-root", Libraries: []File{{HostPath: "/driver-root/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"}},
		Binaries: []File{{HostPath: "/driver-root/usr/bin/nvidia-smi", Path: "/usr/bin/nvidia-smi"}}}
	got := d.Rebase("/")
	if got.Libraries[0].HostPath != "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" || got.Binaries[0].HostPath != "/usr/bin/nvidia-smi" ||
		got.Binaries[0].Path != "/usr/bin/nvidia-smi" || got.Root != "/" {
		t.Fatalf("rebased = %+v", got)
	}
	if d.Libraries[0].HostPath != "/driver-root/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" {
		t.Error("Rebase changed its receiver")
	}
	if r := d.Rebase("/run/nvidia/driver"); r.Binaries[0].HostPath != "/run/nvidia/driver/usr/bin/nvidia-smi" {
		t.Fatalf("rebased = %+v", r)
	}
}
