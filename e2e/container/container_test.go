// Package container runs GPU containers the way a node does: the plugin's
// CDI spec, beside a spec shaped like the NVIDIA Container Toolkit's, is
// injected into an OCI spec by the CDI library (as containerd does) and
// run with runc, on images whose library layout differs from the host's.
// What the workload sees inside is checked: `ldconfig -p` lists
// libcuda.so.1, libcuda.so links to it, NVIDIA_VISIBLE_DEVICES is void,
// and the GPU's device node is there. The hook runs as runc runs it, on
// the host, and hostile images cannot make it write outside their rootfs.
package container

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/driverroot"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/cditest"
)

const driverVersion = "550.54.15"

type layout = harness.Layout

var (
	debian = harness.Debian
	rhel   = harness.RHEL
)

// tools are what every case needs, built once.
type tools struct {
	hook, probe, ldconfig string
	libs                  map[string]string // soname -> a built ELF shared object
	err                   error
}

var (
	toolsOnce sync.Once
	built     tools
)

// need skips the test where it cannot run, except in CI, where missing
// tools are an error: .ci/run installs them.
func need(t *testing.T) tools {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range []string{"runc", "gcc"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if _, err := os.Stat("/sbin/ldconfig"); err != nil {
		missing = append(missing, "/sbin/ldconfig")
	}
	if len(missing) > 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("the container test needs %v (.ci/run installs runc)", missing)
		}
		t.Skipf("needs %v", missing)
	}
	toolsOnce.Do(func() { built = buildTools() })
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built
}

func buildTools() tools {
	dir, err := os.MkdirTemp("", "e2e-container-tools-")
	if err != nil {
		return tools{err: err}
	}
	// Removed with the test binary's temp files; a few MiB.
	tl := tools{hook: filepath.Join(dir, cdi.HookName), probe: filepath.Join(dir, "probe"), ldconfig: "/sbin/ldconfig", libs: map[string]string{}}
	build := func(out, pkg string) error {
		cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %w\n%s", pkg, err, b)
		}
		return nil
	}
	if tl.err = build(tl.hook, harness.ModulePath+"/cmd/"+cdi.HookName); tl.err != nil {
		return tl
	}
	if tl.err = build(tl.probe, "github.com/gpu-device-plugin/gpu-device-plugin/e2e/cluster/images/probe"); tl.err != nil {
		return tl
	}
	// Real shared objects: ldconfig ignores files that are not ELF.
	src := filepath.Join(dir, "empty.c")
	if tl.err = os.WriteFile(src, []byte("int gpu_device_plugin_e2e;\n"), 0o644); tl.err != nil {
		return tl
	}
	for _, soname := range []string{"libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1"} {
		out := filepath.Join(dir, soname)
		if b, err := exec.Command("gcc", "-shared", "-fPIC", "-Wl,-soname,"+soname, "-o", out, src).CombinedOutput(); err != nil {
			tl.err = fmt.Errorf("building %s: %w\n%s", soname, err, b)
			return tl
		}
		tl.libs[soname] = out
	}
	return tl
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

func mkdirs(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// host is a node: a driver root with the driver's libraries in l's
// library directory (versioned files and soname links, as the driver
// installs them) and a /dev with the GPUs' nodes.
func host(t *testing.T, tl tools, l layout) (driverRoot, devRoot string) {
	t.Helper()
	driverRoot = t.TempDir()
	libDir := filepath.Join(driverRoot, l.LibDir)
	for soname, built := range tl.libs {
		base := strings.TrimSuffix(soname, ".1")
		copyFile(t, built, filepath.Join(libDir, base+"."+driverVersion), 0o755)
		if err := os.Symlink(base+"."+driverVersion, filepath.Join(libDir, soname)); err != nil {
			t.Fatal(err)
		}
	}
	devRoot = t.TempDir()
	// 1:3 (/dev/null's numbers), so the container can open them.
	for _, n := range []string{"nvidia0", "nvidia1", "nvidiactl"} {
		if err := unix.Mknod(filepath.Join(devRoot, n), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	return driverRoot, devRoot
}

// image is a root file system of distribution l: its library directory,
// /etc/ld.so.conf including ld.so.conf.d, a static ldconfig, the probe.
func image(t *testing.T, tl tools, l layout) string {
	t.Helper()
	root := t.TempDir()
	mkdirs(t, root, l.LibDir, "etc/ld.so.conf.d", "dev", "proc", "sys", "tmp", "sbin")
	if err := os.WriteFile(filepath.Join(root, "etc/ld.so.conf"), []byte("include /etc/ld.so.conf.d/*.conf\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	copyFile(t, tl.ldconfig, filepath.Join(root, "sbin/ldconfig"), 0o755)
	copyFile(t, tl.probe, filepath.Join(root, "probe"), 0o755)
	// The image's own cache, made when it was built, without the driver.
	if out, err := exec.Command(tl.ldconfig, "-r", root).CombinedOutput(); err != nil {
		t.Fatalf("ldconfig -r %s: %v\n%s", root, err, out)
	}
	return root
}

var gpus = []nvml.GPU{
	{Index: 0, UUID: "GPU-0aa4c5d6-0000-4000-8000-000000000000", Minor: 0},
	{Index: 1, UUID: "GPU-1bb4c5d6-0000-4000-8000-000000000001", Minor: 1},
}

// specDir writes the plugin's GPU spec, with the hook, and a
// toolkit-shaped nvidia.com/gpu spec naming the same GPUs, as on a node
// with the NVIDIA Container Toolkit.
func specDir(t *testing.T, tl tools, driverRoot, devRoot string) string {
	t.Helper()
	driver, err := driverroot.Find(driverRoot)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := cdi.GPUSpec(gpus, driver, cdi.GPUSpecOptions{DevRoot: devRoot, HookPath: tl.hook})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := (cdi.Writer{Dir: dir}).Write(spec); err != nil {
		t.Fatal(err)
	}
	var tg []cditest.GPU
	for _, g := range gpus {
		tg = append(tg, cditest.GPU{Index: g.Index, Minor: g.Minor, UUID: g.UUID})
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(cditest.ToolkitSpec(tg, devRoot)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// report is what the probe prints (e2e/cluster/images/probe).
type report struct {
	Env     map[string]string `json:"env"`
	Devices []struct {
		Path string `json:"path"`
		Char bool   `json:"char"`
	} `json:"devices"`
	Files        map[string]bool   `json:"files"`
	Links        map[string]string `json:"links"`
	LDCache      []string          `json:"ldCache"`
	LDCacheError string            `json:"ldCacheError"`
}

// run injects names from specs into a container of rootfs, as containerd
// does, runs it with runc and returns the probe's report.
func run(t *testing.T, rootfs, specs string, names []string, libDir string) (report, string) {
	t.Helper()
	stdout, stderr, err := runContainer(t, rootfs, specs, names, libDir, nil)
	if err != nil {
		t.Fatalf("runc run: %v\nstdout: %s\nstderr: %s", err, stdout, stderr)
	}
	for _, line := range strings.Split(stdout, "\n") {
		if js, ok := strings.CutPrefix(line, "probe: "); ok {
			var r report
			if err := json.Unmarshal([]byte(js), &r); err != nil {
				t.Fatalf("probe report %q: %v", js, err)
			}
			return r, stderr
		}
	}
	t.Fatalf("no probe report\nstdout: %s\nstderr: %s", stdout, stderr)
	return report{}, ""
}

// runContainer is run's first half: edit, when set, changes the OCI spec after
// the CDI injection, as a runtime or an operator might.
func runContainer(t *testing.T, rootfs, specs string, names []string, libDir string, edit func(*oci.Spec)) (stdout, stderr string, err error) {
	t.Helper()
	bundle := t.TempDir()
	if out, err := exec.Command("runc", "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v\n%s", err, out)
	}
	var spec oci.Spec
	raw, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	spec.Root = &oci.Root{Path: rootfs, Readonly: true}
	spec.Hostname = "gpu"
	spec.Process.Terminal = false
	// What an nvidia/cuda image sets.
	spec.Process.Env = append(spec.Process.Env, "NVIDIA_VISIBLE_DEVICES=all")
	spec.Process.Args = []string{"/probe", "-exit", "-ldconfig", "/sbin/ldconfig",
		"-links", libDir + "/libcuda.so", "-look-for", libDir + "/libcuda.so," + libDir + "/libcuda.so.1"}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(specs), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("the CDI cache refused specs: %v", errs)
	}
	if unresolved, err := cache.InjectDevices(&spec, names...); err != nil {
		t.Fatalf("injecting %v: unresolved %v: %v", names, unresolved, err)
	}
	if edit != nil {
		edit(&spec)
	}
	raw, err = json.MarshalIndent(&spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	id := "gpu-e2e-" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '-'
	}, strings.ToLower(t.Name()))
	if len(id) > 60 {
		id = id[:60]
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command("runc", "--root", filepath.Join(t.TempDir(), "state"), "run", "--bundle", bundle, id)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// Every pairing of host and image layout: CUDA must be found in the
// container whatever the image's distribution.
func TestCUDAInContainer(t *testing.T) {
	tl := need(t)
	for _, hostLayout := range []layout{debian, rhel} {
		for _, imageLayout := range []layout{debian, rhel} {
			t.Run("host "+hostLayout.Name+", image "+imageLayout.Name, func(t *testing.T) {
				driverRoot, devRoot := host(t, tl, hostLayout)
				specs := specDir(t, tl, driverRoot, devRoot)
				rootfs := image(t, tl, imageLayout)
				names := []string{cdi.QualifiedName(cdi.GPUKind, gpus[1].UUID)}
				libDir := hostLayout.LibDir
				for attempt := range 2 { // the second is a container restart
					rep, hookLog := run(t, rootfs, specs, names, libDir)
					checkCUDA(t, rep, libDir, hookLog)
					if t.Failed() {
						t.Fatalf("attempt %d; report %+v", attempt+1, rep)
					}
				}
			})
		}
	}
}

func checkCUDA(t *testing.T, rep report, libDir, hookLog string) {
	t.Helper()
	if rep.LDCacheError != "" {
		t.Errorf("ldconfig -p in the container: %s", rep.LDCacheError)
	}
	want := "libcuda.so.1 (libc6,x86-64) => " + libDir + "/libcuda.so.1"
	if !slices.Contains(rep.LDCache, want) {
		t.Errorf("ldconfig -p in the container lacks %q:\n%s\nhook said: %s", want, strings.Join(rep.LDCache, "\n"), hookLog)
	}
	if got := rep.Links[libDir+"/libcuda.so"]; got != "libcuda.so.1" {
		t.Errorf("%s/libcuda.so -> %q, want libcuda.so.1", libDir, got)
	}
	if !rep.Files[libDir+"/libcuda.so"] {
		t.Errorf("%s/libcuda.so does not resolve in the container", libDir)
	}
	if got := rep.Env["NVIDIA_VISIBLE_DEVICES"]; got != "void" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want void (the image said all)", got)
	}
	var devs []string
	for _, d := range rep.Devices {
		devs = append(devs, d.Path)
	}
	if want := []string{"/dev/nvidia1", "/dev/nvidiactl"}; !slices.Equal(devs, want) {
		t.Errorf("device nodes %v, want %v", devs, want)
	}
}

// A hostile image plants symlinks where the hook writes: the container
// still gets CUDA where it can, and nothing outside its rootfs changes.
func TestHookConfinedToRootfs(t *testing.T) {
	tl := need(t)
	driverRoot, devRoot := host(t, tl, rhel)
	specs := specDir(t, tl, driverRoot, devRoot)
	sentinel := t.TempDir()
	victim := filepath.Join(sentinel, "victim")
	if err := os.WriteFile(victim, []byte("host file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, sentinel)

	rootfs := image(t, tl, debian)
	// ld.so.conf.d points at the host directory, the link path at a host
	// file, and /etc/ld.so.cache at the host file too.
	if err := os.RemoveAll(filepath.Join(rootfs, "etc/ld.so.conf.d")); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"etc/ld.so.conf.d":        sentinel,
		"etc/ld.so.cache":         victim,
		"usr/lib64/libcuda.so":    victim,
		"usr/lib64/libcuda.so.99": "../../../../../../../../" + victim,
	} {
		mkdirs(t, rootfs, filepath.Dir(link))
		os.Remove(filepath.Join(rootfs, link)) // the image's own cache
		if err := os.Symlink(target, filepath.Join(rootfs, link)); err != nil {
			t.Fatal(err)
		}
	}
	rep, hookLog := run(t, rootfs, specs, []string{cdi.QualifiedName(cdi.GPUKind, gpus[0].UUID)}, rhel.LibDir)
	if after := snapshot(t, sentinel); !sameFiles(before, after) {
		t.Fatalf("the hook changed the host outside the rootfs:\n before %v\n after  %v\nhook said: %s", before, after, hookLog)
	}
	// The planted link is left alone rather than followed.
	if got := rep.Links[rhel.LibDir+"/libcuda.so"]; got != victim {
		t.Errorf("the planted libcuda.so link now points at %q", got)
	}
	if rep.Env["NVIDIA_VISIBLE_DEVICES"] != "void" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q", rep.Env["NVIDIA_VISIBLE_DEVICES"])
	}
	// The planted cache link was replaced inside the rootfs, not followed.
	if want := "libcuda.so.1 (libc6,x86-64) => /usr/lib64/libcuda.so.1"; !slices.Contains(rep.LDCache, want) {
		t.Errorf("ldconfig -p lacks %q: %v", want, rep.LDCache)
	}
}

// snapshot lists every file under dir with its content.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			out[p] = "dir"
			return nil
		}
		b, err := os.ReadFile(p)
		out[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameFiles(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Magic links: under runc, at createContainer time, the container's /proc is mounted and
// /proc/1 is runc's init, whose root is still the host's /. An image whose paths go
// through it must not make the hook, or the image's ldconfig, write on the host.
func TestHookMagicLinks(t *testing.T) {
	tl := need(t)
	driverRoot, devRoot := host(t, tl, rhel)
	specs := specDir(t, tl, driverRoot, devRoot)
	names := []string{cdi.QualifiedName(cdi.GPUKind, gpus[0].UUID)}
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, rootfs, sentinel string)
	}{{
		name: "ld.so.conf.d through /proc/1/root",
		plant: func(t *testing.T, rootfs, sentinel string) {
			replaceWithSymlink(t, rootfs, "etc/ld.so.conf.d", "/proc/1/root"+sentinel)
		},
	}, {
		name: "ld.so.conf.d through ../proc/1/root",
		plant: func(t *testing.T, rootfs, sentinel string) {
			replaceWithSymlink(t, rootfs, "etc/ld.so.conf.d", "../proc/1/root"+sentinel)
		},
	}, {
		name: "/etc through /proc/1/root",
		plant: func(t *testing.T, rootfs, sentinel string) {
			mkdirs(t, sentinel, "ld.so.conf.d") // so that each write would land
			replaceWithSymlink(t, rootfs, "etc", "/proc/1/root"+sentinel)
		},
	}, {
		name: "ldconfig writes through /proc/1/root",
		plant: func(t *testing.T, rootfs, sentinel string) {
			src := filepath.Join(t.TempDir(), "evil.c")
			code := `#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(void) {
	open("/proc/1/root" SENTINEL "/pwned", O_WRONLY | O_CREAT, 0644);
	open(SENTINEL "/pwned", O_WRONLY | O_CREAT, 0644);
	syscall(SYS_add_key, "user", "evil", "secret", 6, -4);
	return 0;
}
`
			if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("gcc", "-static", "-O1", fmt.Sprintf("-DSENTINEL=%q", sentinel), "-o", filepath.Join(rootfs, "sbin/ldconfig"), src).CombinedOutput(); err != nil {
				t.Fatalf("gcc: %v\n%s", err, out)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			sentinel := t.TempDir()
			if err := os.WriteFile(filepath.Join(sentinel, "victim"), []byte("host file\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			rootfs := image(t, tl, debian)
			tc.plant(t, rootfs, sentinel)
			before := snapshot(t, sentinel)
			rep, hookLog := run(t, rootfs, specs, names, rhel.LibDir)
			if after := snapshot(t, sentinel); !sameFiles(before, after) {
				t.Fatalf("the host changed outside the rootfs:\n before %v\n after  %v\nhook said: %s", before, after, hookLog)
			}
			if got := rep.Env["NVIDIA_VISIBLE_DEVICES"]; got != "void" {
				t.Errorf("NVIDIA_VISIBLE_DEVICES=%q: the container did not run as injected", got)
			}
		})
	}
}

func replaceWithSymlink(t *testing.T, rootfs, rel, target string) {
	t.Helper()
	if err := os.RemoveAll(filepath.Join(rootfs, rel)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(rootfs, rel)); err != nil {
		t.Fatal(err)
	}
}
