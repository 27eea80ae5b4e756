package nvml

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// The real binding and go-nvml's mock must both fit Library.
var (
	_ Library = gonvml.New()
	_ Library = (*dgxa100.Server)(nil)
)

func TestLibraryPath(t *testing.T) {
	triplet := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[runtime.GOARCH]
	if triplet == "" {
		t.Skipf("no multiarch directory known for %s", runtime.GOARCH)
	}
	tests := []struct {
		name       string
		noRoot     bool     // pass "" as the driver root
		rootSlash  bool     // pass "/" as the driver root
		explicit   string   // --nvml-library
		files      []string // created under the driver root
		dirs       []string // created under the driver root, named like the library
		links      []string // dangling symlinks named like the library
		wantInRoot string   // expected path relative to the root; "" for the bare soname
	}{
		{name: "explicit path wins", explicit: "/opt/nvml/libnvidia-ml.so.1", files: []string{"usr/lib64/libnvidia-ml.so.1"}},
		{name: "no driver root lets dlopen search", noRoot: true},
		{name: "root slash lets dlopen search", rootSlash: true},
		{name: "multiarch directory", files: []string{"usr/lib/" + triplet + "/libnvidia-ml.so.1"}, wantInRoot: "usr/lib/" + triplet + "/libnvidia-ml.so.1"},
		{name: "lib64", files: []string{"usr/lib64/libnvidia-ml.so.1"}, wantInRoot: "usr/lib64/libnvidia-ml.so.1"},
		{name: "plain lib", files: []string{"lib/libnvidia-ml.so.1"}, wantInRoot: "lib/libnvidia-ml.so.1"},
		{name: "Debian alternatives directory", files: []string{"usr/lib/" + triplet + "/nvidia/current/libnvidia-ml.so.1"}, wantInRoot: "usr/lib/" + triplet + "/nvidia/current/libnvidia-ml.so.1"},
		{
			name:       "multiarch preferred over lib64",
			files:      []string{"usr/lib64/libnvidia-ml.so.1", "usr/lib/" + triplet + "/libnvidia-ml.so.1"},
			wantInRoot: "usr/lib/" + triplet + "/libnvidia-ml.so.1",
		},
		{name: "nothing under the root falls back to the soname"},
		{name: "directory with the library's name is skipped", dirs: []string{"usr/lib64/libnvidia-ml.so.1"}},
		{name: "dangling soname link is skipped", links: []string{"usr/lib64/libnvidia-ml.so.1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for _, f := range tt.files {
				mkfile(t, filepath.Join(root, f))
			}
			for _, d := range tt.dirs {
				if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, l := range tt.links {
				p := filepath.Join(root, l)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("libnvidia-ml.so.999.99", p); err != nil {
					t.Fatal(err)
				}
			}
			driverRoot := root
			switch {
			case tt.noRoot:
				driverRoot = ""
			case tt.rootSlash:
				driverRoot = "/"
			}

			got := LibraryPath(driverRoot, tt.explicit)

			want := "libnvidia-ml.so.1"
			switch {
			case tt.explicit != "":
				want = tt.explicit
			case tt.wantInRoot != "":
				want = filepath.Join(root, tt.wantInRoot)
			}
			if got != want {
				t.Errorf("LibraryPath(%q, %q) = %q, want %q", driverRoot, tt.explicit, got, want)
			}
		})
	}
}

func TestLibraryDirsFollowArchitecture(t *testing.T) {
	tests := []struct {
		goarch   string
		want     string
		wantNone string
	}{
		{goarch: "amd64", want: "usr/lib/x86_64-linux-gnu", wantNone: "aarch64"},
		{goarch: "arm64", want: "usr/lib/aarch64-linux-gnu", wantNone: "x86_64"},
		{goarch: "riscv64", want: "usr/lib64", wantNone: "linux-gnu"},
	}
	for _, tt := range tests {
		t.Run(tt.goarch, func(t *testing.T) {
			dirs := LibraryDirs(tt.goarch)
			if dirs[0] != tt.want {
				t.Errorf("first directory = %q, want %q", dirs[0], tt.want)
			}
			for _, d := range dirs {
				if strings.Contains(d, tt.wantNone) {
					t.Errorf("directory %q is for another architecture", d)
				}
			}
		})
	}
}

func mkfile(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOpenWithoutLibrary(t *testing.T) {
	tests := []struct {
		name string
		path string
	}{
		{name: "missing file", path: filepath.Join(t.TempDir(), "libnvidia-ml.so.1")},
		// Not an ELF object: dlopen fails the same way.
		{name: "not a shared object", path: writeJunk(t)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lib, _, err := Load(Open, "/", tt.path)
			if err == nil {
				lib.Shutdown()
				t.Fatalf("Open(%q) succeeded, want ErrNoDriver", tt.path)
			}
			if !errors.Is(err, ErrNoDriver) {
				t.Errorf("Open error %v does not match ErrNoDriver", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.path) || !strings.Contains(msg, "--nvml-library") || strings.Contains(msg, "\n") {
				t.Errorf("Load error %q should be one line naming the path and the flag", msg)
			}
		})
	}
}

func writeJunk(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	if err := os.WriteFile(p, []byte("not a library"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
