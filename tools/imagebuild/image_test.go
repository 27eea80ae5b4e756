package main

import (
	"bytes"
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
	dra := draStandIn(t, self)

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
			img, err := Image(Options{Binary: self, Hook: hook, DRA: dra, Base: b, PCIIDs: "none", Version: "v1.0.0", Commit: "abc", Created: time.Unix(1, 0), WorkDir: t.TempDir()})
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
			for p, want := range map[string]string{BinaryPath: self, HookPath: hook, DRAPath: dra} {
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

// serve execs gpu-device-plugin-dra from its own directory first, so the
// image keeps the two together, and refuses to be built without it.
func TestDRAExecutable(t *testing.T) {
	if path.Dir(DRAPath) != path.Dir(BinaryPath) || path.Base(DRAPath) != "gpu-device-plugin-dra" {
		t.Errorf("DRAPath %s is not gpu-device-plugin-dra beside BinaryPath %s", DRAPath, BinaryPath)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Image(Options{Binary: self, Hook: staticBinary(t), Base: "unused", PCIIDs: "none"}); err == nil || !strings.Contains(err.Error(), "-dra") {
		t.Errorf("an image without the DRA executable: err %v, want one naming -dra", err)
	}
}

// A scratch image has one loader and the libraries of both dynamic
// binaries; binaries that disagree on either are refused.
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
		t.Errorf("a static DRA executable refused: %v", err)
	}
	if err := plugin().merge(&Runtime{Arch: "arm64"}); err == nil {
		t.Error("an arm64 DRA executable accepted beside an amd64 plugin")
	}
	if err := plugin().merge(&Runtime{Arch: "amd64", Interpreter: "/lib/ld-musl-x86_64.so.1"}); err == nil {
		t.Error("a DRA executable naming another loader accepted")
	}
}
