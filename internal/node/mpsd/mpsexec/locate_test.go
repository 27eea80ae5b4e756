package mpsexec

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpstest"
)

func TestExistsIn(t *testing.T) {
	root := t.TempDir()
	mk := func(p string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, p string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	mk("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	link("usr/lib", "lib")                                                    // a merged /usr, relative
	link("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "usr/lib64/ld.so") // absolute: the root's
	link("../../../../../etc/passwd", "usr/lib64/out")                        // .. stops at the root
	link("loop", "loop")
	for path, want := range map[string]bool{
		"/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2": true,
		"/usr/lib64/ld.so":                           true,
		"/usr/lib64/out":                             false, // no /etc/passwd in the root
		"/loop":                                      false,
		"/lib64/ld.so":                               false,
		"/usr/lib/missing":                           false,
	} {
		if got := existsIn(root, path); got != want {
			t.Errorf("existsIn(%s) = %v, want %v", path, got, want)
		}
	}
}

// A whole root is chrooted into; a root of programs and libraries only is
// run in place with its libraries; "/" is neither; no program: an error
// naming the root and the setting.
func TestLocate(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// This test binary links cgo (NVML), so it is dynamic, as the driver's
	// program is.
	interp, err := interpreter(self)
	if err != nil || interp == "" {
		t.Fatalf("the test binary's loader: %q, %v", interp, err)
	}
	install := func(root, dir string) {
		b, err := os.ReadFile(self)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, dir, controlName)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	whole := t.TempDir()
	install(whole, "usr/bin")
	if err := os.MkdirAll(filepath.Join(whole, filepath.Dir(interp)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(whole, interp), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := Locate(whole); err != nil || !reflect.DeepEqual(got, Spec{DriverRoot: whole, Binary: "/usr/bin/" + controlName}) {
		t.Errorf("whole root: %+v, %v", got, err)
	}

	gke := t.TempDir() // bin/ and lib64/ only
	install(gke, "bin")
	if err := os.Mkdir(filepath.Join(gke, "lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := Spec{Binary: filepath.Join(gke, "bin", controlName), Env: []string{"LD_LIBRARY_PATH=" + filepath.Join(gke, "lib64")}}
	if got, err := Locate(gke); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("programs and libraries only: %+v, %v; want %+v", got, err, want)
	}

	// A static program (the mock node's stand-in) needs no loader.
	static, _ := mpstest.DriverRoot(t)
	if got, err := Locate(static); err != nil || got.DriverRoot != static {
		t.Errorf("static program: %+v, %v", got, err)
	}
	if got, err := Locate("/"); err == nil && got.DriverRoot != "" {
		t.Errorf("/: %+v", got)
	}

	empty := t.TempDir()
	if _, err := Locate(empty); err == nil || !strings.Contains(err.Error(), empty) || !strings.Contains(err.Error(), "--driver-root") {
		t.Errorf("no program: %v", err)
	}
}
