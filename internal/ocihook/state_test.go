package ocihook

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadState(t *testing.T) {
	for _, tc := range []struct{ name, in, bundle, err string }{
		{name: "runtime state", in: `{"ociVersion":"1.2.0","id":"c1","status":"creating","pid":42,"bundle":"/run/b","annotations":{"a":"b"}}`, bundle: "/run/b"},
		{name: "bad JSON", in: `{"bundle":`, err: "container state on stdin"},
		{name: "no bundle", in: `{"id":"c1"}`, err: "not an absolute path"},
		{name: "relative bundle", in: `{"bundle":"run/b"}`, err: "not an absolute path"},
		{name: "too long", in: `{"id":"` + strings.Repeat("x", maxState) + `"}`, err: "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := ReadState(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || st.Bundle != tc.bundle {
				t.Fatalf("ReadState = %+v, %v; want bundle %q", st, err, tc.bundle)
			}
		})
	}
}

func TestRootFS(t *testing.T) {
	dir := t.TempDir()
	elsewhere := filepath.Join(dir, "elsewhere", "rootfs")
	for _, d := range []string{filepath.Join(dir, "bundle", "rootfs"), elsewhere} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ name, config, want, err string }{
		{name: "relative root.path", config: `{"root":{"path":"rootfs"}}`, want: filepath.Join(dir, "bundle", "rootfs")},
		{name: "relative root.path cleaned", config: `{"root":{"path":"./x/../rootfs/"}}`, want: filepath.Join(dir, "bundle", "rootfs")},
		{name: "absolute root.path", config: `{"root":{"path":"` + elsewhere + `"}}`, want: elsewhere},
		{name: "bad JSON", config: `{"root":`, err: "config.json"},
		{name: "no root", config: `{"ociVersion":"1.2.0"}`, err: "root.path is not set"},
		{name: "missing rootfs", config: `{"root":{"path":"nope"}}`, err: "container rootfs"},
		{name: "rootfs not a directory", config: `{"root":{"path":"config.json"}}`, err: "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bundle := filepath.Join(dir, "bundle")
			if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(tc.config), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := RootFS(bundle)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("RootFS = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("missing bundle", func(t *testing.T) {
		if _, err := RootFS(filepath.Join(dir, "no-such-bundle")); err == nil || !strings.Contains(err.Error(), "reading bundle config") {
			t.Fatalf("error = %v, want one about the bundle config", err)
		}
	})
}
