package cdi

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// fooSpec is a small valid spec of kind example.com/foo with n devices.
func fooSpec(t *testing.T, n int) *specs.Spec {
	t.Helper()
	var devices []Device
	for i := range n {
		name := "foo" + string(rune('0'+i))
		devices = append(devices, Device{Name: name, Edits: Edits{Nodes: []DeviceNode{{Path: "/dev/" + name}}}})
	}
	s, err := Spec("example.com/foo", devices, Edits{Env: []string{"FOO=1"}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestWriterWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "cdi")
	w := Writer{Dir: dir}
	path, err := w.Write(fooSpec(t, 2))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "gpu-device-plugin_example.com-foo.json"); path != want {
		t.Errorf("path %s, want %s", path, want)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, %v; want 0644", fi.Mode(), err)
	}
	if got := names(t, dir); !slices.Equal(got, []string{filepath.Base(path)}) {
		t.Errorf("directory holds %v, want the spec alone", got)
	}
	read, err := cdiapi.ReadSpec(path, 0)
	if err != nil || len(read.Devices) != 2 {
		t.Fatalf("the CDI library reads %+v, %v", read, err)
	}

	t.Run("same content leaves the file alone", func(t *testing.T) {
		before := inode(t, path)
		if _, err := w.Write(fooSpec(t, 2)); err != nil {
			t.Fatal(err)
		}
		if inode(t, path) != before {
			t.Error("file replaced")
		}
	})
	t.Run("new content replaces the file", func(t *testing.T) {
		before := inode(t, path)
		if _, err := w.Write(fooSpec(t, 3)); err != nil {
			t.Fatal(err)
		}
		if inode(t, path) == before {
			t.Error("file rewritten in place, not replaced")
		}
		if read, err := cdiapi.ReadSpec(path, 0); err != nil || len(read.Devices) != 3 {
			t.Errorf("the CDI library reads %+v, %v", read, err)
		}
	})
	t.Run("defaults", func(t *testing.T) {
		p, err := Writer{}.Path(GPUKind)
		if err != nil || p != "/var/run/cdi/gpu-device-plugin_gpu-device-plugin.github.io-gpu.json" {
			t.Errorf("default path %q, %v", p, err)
		}
	})
}

func TestWriterRefusesInvalidSpecs(t *testing.T) {
	badName := fooSpec(t, 1)
	badName.Devices[0].Name = "foo 0"
	badEnv := fooSpec(t, 1)
	badEnv.ContainerEdits.Env = []string{"FOO"}
	// A validator registered with the library runs only in its loader, so
	// this spec gets past Validate and is caught on the temporary file.
	refused, err := Spec("example.com/refused", []Device{{Name: "r0", Edits: Edits{Env: []string{"R=0"}}}}, Edits{})
	if err != nil {
		t.Fatal(err)
	}
	cdiapi.SetSpecValidator(refuseKind("example.com/refused"))
	t.Cleanup(func() { cdiapi.SetSpecValidator(nil) })

	tests := []struct {
		name   string
		spec   *specs.Spec
		want   string
		loader bool // refused by the library's loader, after Validate
	}{
		{name: "device name with a space", spec: badName, want: `invalid character ' ' in device name "foo 0"`},
		{name: "env without =", spec: badEnv, want: `invalid environment variable "FOO"`},
		{name: "nil", spec: nil, want: "nil"},
		{name: "refused by a validator registered with the library", spec: refused, want: "refused by the CDI library: Spec validation failed: kind example.com/refused", loader: true},
	}
	for _, tt := range tests {
		t.Run(tt.name+": nothing written", func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "cdi")
			w := Writer{Dir: dir}
			_, err := w.Write(tt.spec)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if tt.loader {
				if got := names(t, dir); len(got) != 0 {
					t.Errorf("directory holds %v, want nothing", got)
				}
			} else if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("directory created (%v); a spec refused by Validate touches nothing", err)
			}
		})
		if tt.spec == nil {
			continue
		}
		t.Run(tt.name+": the previous file stays", func(t *testing.T) {
			w := Writer{Dir: t.TempDir()}
			path, err := w.Write(fooSpec(t, 1))
			if err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(path)
			if _, err := w.Write(tt.spec); err == nil {
				t.Fatal("invalid spec written")
			}
			after, _ := os.ReadFile(path)
			if string(after) != string(before) || !slices.Equal(names(t, w.Dir), []string{filepath.Base(path)}) {
				t.Errorf("spec directory changed: %v", names(t, w.Dir))
			}
		})
	}
}

type refuseKind string

func (k refuseKind) Validate(s *specs.Spec) error {
	if s.Kind == string(k) {
		return errors.New("kind " + s.Kind + " is refused here")
	}
	return nil
}

// TestWriterIsAtomic rewrites a spec many times while a reader, as a
// runtime's cache would, reads it in a loop: every read must be a whole,
// valid spec, the old one or the new one.
func TestWriterIsAtomic(t *testing.T) {
	w := Writer{Dir: t.TempDir()}
	small, large := fooSpec(t, 1), fooSpec(t, 9)
	path, err := w.Write(small)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	result := make(chan error, 1)
	reads := 0
	go func() {
		for {
			select {
			case <-stop:
				result <- nil
				return
			default:
			}
			s, err := cdiapi.ReadSpec(path, 0)
			if err != nil {
				result <- err
				return
			}
			if n := len(s.Devices); n != 1 && n != 9 {
				result <- errors.New("spec with an unexpected number of devices")
				return
			}
			reads++
		}
	}()
	for i := range 200 {
		s := small
		if i%2 == 0 {
			s = large
		}
		if _, err := w.Write(s); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if err := <-result; err != nil {
		t.Fatalf("reader saw a bad spec: %v", err)
	}
	if reads == 0 {
		t.Error("the reader never read")
	}
	t.Logf("%d reads during 200 writes", reads)
	if got := names(t, w.Dir); !slices.Equal(got, []string{filepath.Base(path)}) {
		t.Errorf("directory holds %v, want the spec alone", got)
	}
}

func TestWriterRemove(t *testing.T) {
	setup := func(t *testing.T) (Writer, string) {
		dir := t.TempDir()
		w := Writer{Dir: dir}
		kept, err := w.Write(fooSpec(t, 1))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{
			"gpu-device-plugin_example.com-nic.json",         // ours, stale
			"gpu-device-plugin_example.com-old.yaml",         // ours, stale
			".gpu-device-plugin_nvidia.com-gpu.json.tmp4242", // ours, left by a crash
			"nvidia.yaml",                                 // nvidia-ctk's
			"nvidia.com-gpu.json",                         // the library's default name
			"other-plugin_nvidia.com-gpu.json",            // another owner
			"gpu-device-plugin.json",                      // no separator: not ours
			"gpu-device-plugin-extra_nvidia.com-gpu.json", // a longer owner
			"gpu-device-plugin_notes.txt",                 // not a spec
			".other-plugin_nvidia.com-gpu.json.tmp1",      // another owner's temporary file
		} {
			if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Mkdir(filepath.Join(dir, "gpu-device-plugin_dir.json"), 0o755); err != nil {
			t.Fatal(err)
		}
		return w, kept
	}
	others := []string{
		".other-plugin_nvidia.com-gpu.json.tmp1",
		"gpu-device-plugin-extra_nvidia.com-gpu.json",
		"gpu-device-plugin.json",
		"gpu-device-plugin_dir.json",
		"gpu-device-plugin_notes.txt",
		"nvidia.com-gpu.json",
		"nvidia.yaml",
		"other-plugin_nvidia.com-gpu.json",
	}

	t.Run("stale: ours not kept go, others stay", func(t *testing.T) {
		w, kept := setup(t)
		if err := w.RemoveStale([]string{kept}); err != nil {
			t.Fatal(err)
		}
		want := append([]string{filepath.Base(kept)}, others...)
		slices.Sort(want)
		if got := names(t, w.Dir); !slices.Equal(got, want) {
			t.Errorf("left\n %v\nwant\n %v", got, want)
		}
	})
	t.Run("stale: keep by bare name", func(t *testing.T) {
		w, kept := setup(t)
		if err := w.RemoveStale([]string{filepath.Base(kept)}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(kept); err != nil {
			t.Error(err)
		}
	})
	t.Run("all: ours go, others stay", func(t *testing.T) {
		w, _ := setup(t)
		if err := w.RemoveAll(); err != nil {
			t.Fatal(err)
		}
		if got := names(t, w.Dir); !slices.Equal(got, others) {
			t.Errorf("left\n %v\nwant\n %v", got, others)
		}
	})
	t.Run("missing directory is nothing to remove", func(t *testing.T) {
		w := Writer{Dir: filepath.Join(t.TempDir(), "none")}
		if err := w.RemoveAll(); err != nil {
			t.Error(err)
		}
		if err := w.RemoveStale(nil); err != nil {
			t.Error(err)
		}
	})
}

func TestWriterOwner(t *testing.T) {
	for _, owner := range []string{"../etc", "a/b", "-x", "a_b", "a b"} {
		w := Writer{Dir: t.TempDir(), Owner: owner}
		if _, err := w.Write(fooSpec(t, 1)); err == nil || !strings.Contains(err.Error(), "owner") {
			t.Errorf("owner %q: write error %v", owner, err)
		}
		if err := w.RemoveAll(); err == nil {
			t.Errorf("owner %q: RemoveAll accepted", owner)
		}
		if got := names(t, w.Dir); len(got) != 0 {
			t.Errorf("owner %q: wrote %v", owner, got)
		}
	}
	w := Writer{Dir: t.TempDir(), Owner: "my-plugin.v2"}
	path, err := w.Write(fooSpec(t, 1))
	if err != nil || filepath.Base(path) != "my-plugin.v2_example.com-foo.json" {
		t.Errorf("path %s, %v", path, err)
	}
}
