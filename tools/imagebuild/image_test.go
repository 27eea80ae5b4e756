package main

import (
	"bytes"
	"debug/elf"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/gpu-device-plugin/gpu-device-plugin/tools/elfcheck"
)

func TestCreationTime(t *testing.T) {
	for _, tc := range []struct {
		name, flag, env string
		want            time.Time
		wantErr         bool
	}{
		{"nothing: the epoch, for reproducible builds", "", "", time.Unix(0, 0).UTC(), false},
		{"SOURCE_DATE_EPOCH", "", "1700000000", time.Unix(1700000000, 0).UTC(), false},
		{"flag wins over the environment", "2024-01-02T03:04:05Z", "1700000000", time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC), false},
		{"garbage", "yesterday", "", time.Time{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := creationTime(tc.flag, tc.env)
			if (err != nil) != tc.wantErr || !got.Equal(tc.want) {
				t.Errorf("creationTime(%q, %q) = %v, %v; want %v, error %v", tc.flag, tc.env, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// A base image given as an OCI layout directory, an OCI layout tarball or
// a docker-archive gets one layer on top and keeps its own settings.
func TestBuildOnBase(t *testing.T) {
	dir := t.TempDir()
	base, err := random.Image(256, 2)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := base.ConfigFile()
	cf = cf.DeepCopy()
	cf.Config.Env = []string{"PATH=/usr/bin", "TZ=UTC"}
	cf.Config.Labels = map[string]string{"base.example/os": "debian12"}
	if base, err = mutate.ConfigFile(base, cf); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable() // any ELF binary will do on a base
	if err != nil {
		t.Fatal(err)
	}
	arch := archOf(t, self)
	base, _ = mutate.ConfigFile(base, withPlatform(t, base, arch))
	hook := staticBinary(t)
	dp := modeStandIn(t, self, "dp")
	dra := modeStandIn(t, self, "dra")
	controller := modeStandIn(t, self, "controller")

	ociDir := filepath.Join(dir, "oci")
	p, err := layout.Write(ociDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(base, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: arch})); err != nil {
		t.Fatal(err)
	}
	dockerTar := filepath.Join(dir, "base.tar")
	if err := tarball.WriteToFile(dockerTar, name.MustParseReference("base:1"), base); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(dir, "oci.tar")
	if err := tarDir(ociDir, ociTar); err != nil {
		t.Fatal(err)
	}

	for _, b := range []string{ociDir, ociTar, dockerTar} {
		t.Run(filepath.Base(b), func(t *testing.T) {
			img, err := Image(Options{Binary: self, Hook: hook, DP: dp, DRA: dra, Controller: controller, Base: b, PCIIDs: "none", Version: "v1.0.0", Commit: "abc", Created: time.Unix(1, 0), WorkDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			layers, _ := img.Layers()
			if len(layers) != 3 {
				t.Errorf("%d layers, want the base's 2 and one more", len(layers))
			}
			cf, _ := img.ConfigFile()
			if !slices.Equal(cf.Config.Entrypoint, Entrypoint) || !slices.Equal(cf.Config.Cmd, Cmd) || cf.Config.User != User {
				t.Errorf("entrypoint %q cmd %q user %q", cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.User)
			}
			if !slices.Equal(cf.Config.Env, []string{"PATH=/usr/bin", "TZ=UTC"}) {
				t.Errorf("env %q, want the base's", cf.Config.Env)
			}
			if cf.Config.Labels["base.example/os"] != "debian12" || cf.Config.Labels["org.opencontainers.image.version"] != "v1.0.0" {
				t.Errorf("labels %v: want the base's and ours", cf.Config.Labels)
			}
			top := newestLayerFiles(t, img)
			for p, want := range map[string]string{BinaryPath: self, HookPath: hook, DPPath: dp, DRAPath: dra, ControllerPath: controller} {
				f, ok := top[clean(p)]
				if !ok {
					t.Errorf("the new layer has no %s", p)
					continue
				}
				if f.mode&0o111 == 0 || !bytes.Equal(f.content, mustRead(t, want)) {
					t.Errorf("%s: mode %o, want %s, executable", p, f.mode, want)
				}
			}
		})
	}
}

func TestBaseWithoutMatchingPlatform(t *testing.T) {
	dir := t.TempDir()
	base, _ := random.Image(16, 1)
	p, _ := layout.Write(dir, empty.Index)
	if err := p.AppendImage(base, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "s390x"})); err != nil {
		t.Fatal(err)
	}
	if _, err := loadBase(dir, "amd64", t.TempDir()); err == nil {
		t.Fatal("an s390x-only base was accepted for amd64")
	}
}

// The hook runs on the host, whatever its libc: the image refuses one that
// would need a dynamic loader, one for another architecture, or none.
func TestHookMustBeStatic(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	arch := archOf(t, self)
	other := "arm64"
	if arch == other {
		other = "amd64"
	}
	if err := elfcheck.Static(staticBinary(t), arch); err != nil {
		t.Errorf("a CGO_ENABLED=0 build refused: %v", err)
	}
	if err := elfcheck.Static(staticBinary(t), other); err == nil || !strings.Contains(err.Error(), "the plugin for "+other) {
		t.Errorf("a hook for %s accepted for a %s plugin (err %v)", arch, other, err)
	}
	dynamic, err := exec.LookPath("true")
	if err != nil || !hasInterp(t, dynamic) {
		t.Log("no dynamically linked true(1) here: the dynamic case is not checked")
	} else if err := elfcheck.Static(dynamic, archOf(t, dynamic)); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("dynamically linked %s accepted as the hook (err %v)", dynamic, err)
	}
	if _, err := Image(Options{Binary: self, Base: "unused", PCIIDs: "none"}); err == nil || !strings.Contains(err.Error(), "-hook") {
		t.Errorf("an image without the hook: err %v, want one naming -hook", err)
	}
}

// serve execs gpu-device-plugin-dp (the device-plugin mode's executable,
// which it runs by default) and gpu-device-plugin-dra (DRA mode's) from
// its own directory, and gpu-device-plugin-dra compute-domain-controller
// execs gpu-device-plugin-controller from its own, so the image keeps the
// four together, and refuses to be built without any of them.
func TestModeExecutables(t *testing.T) {
	for p, name := range map[string]string{DPPath: "gpu-device-plugin-dp", DRAPath: "gpu-device-plugin-dra", ControllerPath: "gpu-device-plugin-controller"} {
		if path.Dir(p) != path.Dir(BinaryPath) || path.Base(p) != name {
			t.Errorf("%s is not %s beside BinaryPath %s", p, name, BinaryPath)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	hook := staticBinary(t)
	dp, dra, controller := modeStandIn(t, self, "dp"), modeStandIn(t, self, "dra"), modeStandIn(t, self, "controller")
	for _, tc := range []struct {
		name, flag string
		o          Options
	}{
		{"the device-plugin mode's executable", "-dp", Options{Binary: self, Hook: hook, DRA: dra, Controller: controller, Base: "unused", PCIIDs: "none"}},
		{"the DRA executable", "-dra", Options{Binary: self, Hook: hook, DP: dp, Controller: controller, Base: "unused", PCIIDs: "none"}},
		{"the ComputeDomain controller", "-controller", Options{Binary: self, Hook: hook, DP: dp, DRA: dra, Base: "unused", PCIIDs: "none"}},
	} {
		if _, err := Image(tc.o); err == nil || !strings.Contains(err.Error(), tc.flag+" ") {
			t.Errorf("an image without %s: err %v, want one naming %s", tc.name, err, tc.flag)
		}
	}
}

// Each executable serve runs is checked as the plugin's companion: one for
// another architecture, or naming another dynamic loader, is refused, and
// one that is static is taken.
func TestModeExecutableChecks(t *testing.T) {
	sysroot := t.TempDir()
	const loader = "/lib64/ld-linux-x86-64.so.2"
	tree(t, sysroot, map[string][]byte{
		"lib64/ld-linux-x86-64.so.2":          fakeELF(elf.EM_X86_64, "", nil),
		"lib/x86_64-linux-gnu/libc.so.6":      fakeELF(elf.EM_X86_64, "", nil),
		"lib/ld-musl-x86_64.so.1":             fakeELF(elf.EM_X86_64, "", nil),
		"lib/x86_64-linux-gnu/libresolv.so.2": fakeELF(elf.EM_X86_64, "", []string{"libc.so.6"}),
	})
	bins := t.TempDir()
	tree(t, bins, map[string][]byte{
		"plugin":  fakeELF(elf.EM_X86_64, loader, []string{"libc.so.6"}),
		"hook":    fakeELF(elf.EM_X86_64, "", nil),
		"good":    fakeELF(elf.EM_X86_64, loader, []string{"libresolv.so.2", "libc.so.6"}),
		"static":  fakeELF(elf.EM_X86_64, "", nil),
		"arm64":   fakeELF(elf.EM_AARCH64, "", nil),
		"musl":    fakeELF(elf.EM_X86_64, "/lib/ld-musl-x86_64.so.1", nil),
		"missing": fakeELF(elf.EM_X86_64, loader, []string{"libnowhere.so.1"}),
	})
	bin := func(n string) string { return filepath.Join(bins, n) }
	for _, mode := range []struct {
		name string
		set  func(o *Options, file string)
	}{
		{"the device-plugin mode's executable", func(o *Options, f string) { o.DP = f }},
		{"the DRA executable", func(o *Options, f string) { o.DRA = f }},
		{"the ComputeDomain controller", func(o *Options, f string) { o.Controller = f }},
	} {
		for _, tc := range []struct{ file, want string }{
			{"good", ""},
			{"static", ""},
			{"arm64", "is for arm64, the plugin for amd64"},
			{"musl", "its dynamic loader is /lib/ld-musl-x86_64.so.1"},
			{"missing", "libnowhere.so.1"},
		} {
			t.Run(mode.name+"/"+tc.file, func(t *testing.T) {
				o := Options{Binary: bin("plugin"), Hook: bin("hook"), DP: bin("static"), DRA: bin("static"), Controller: bin("static"),
					Sysroot: sysroot, PCIIDs: "none", Created: time.Unix(1, 0)}
				mode.set(&o, bin(tc.file))
				img, err := Image(o)
				if tc.want == "" {
					if err != nil {
						t.Fatal(err)
					}
					if _, ok := layerFiles(t, img, 0)["lib/x86_64-linux-gnu/libresolv.so.2"]; !ok && tc.file == "good" {
						t.Error("the glibc layer lacks libresolv.so.2, which the executable needs")
					}
					return
				}
				if err == nil || !strings.Contains(err.Error(), mode.name) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("err %v, want one naming %s and saying %q", err, mode.name, tc.want)
				}
			})
		}
	}
}

// A scratch image has one loader and the libraries of every dynamic
// binary (the plugin and the executables serve runs); binaries that
// disagree on either are refused.
func TestRuntimeMerge(t *testing.T) {
	plugin := func() *Runtime {
		return &Runtime{Arch: "amd64", Interpreter: "/lib64/ld-linux-x86-64.so.2", InterpFile: "/host/ld",
			Libs: map[string]string{"libc.so.6": "/host/libc"}}
	}
	rt := plugin()
	if err := rt.merge(&Runtime{Arch: "amd64", Interpreter: "/lib64/ld-linux-x86-64.so.2",
		Libs: map[string]string{"libc.so.6": "/other/libc", "libresolv.so.2": "/host/libresolv"}}); err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"libc.so.6": "/host/libc", "libresolv.so.2": "/host/libresolv"}; !maps.Equal(rt.Libs, want) {
		t.Errorf("libs %v, want %v", rt.Libs, want)
	}
	if err := plugin().merge(&Runtime{Arch: "amd64"}); err != nil {
		t.Errorf("a static executable (as the dp or DRA one may be) refused: %v", err)
	}
	if err := plugin().merge(&Runtime{Arch: "arm64"}); err == nil {
		t.Error("an arm64 executable accepted beside an amd64 plugin")
	}
	if err := plugin().merge(&Runtime{Arch: "amd64", Interpreter: "/lib/ld-musl-x86_64.so.1"}); err == nil {
		t.Error("an executable naming another loader accepted")
	}
}
