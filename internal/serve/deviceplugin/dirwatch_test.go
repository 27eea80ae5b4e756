package deviceplugin

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestDirWatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		// do changes dir (and other, a directory beside it) and returns
		// the events it must cause, in order.
		do func(t *testing.T, dir, other string) []dirEvent
	}{
		{"a created file is created", func(t *testing.T, dir, _ string) []dirEvent {
			touch(t, filepath.Join(dir, "kubelet.sock"))
			return []dirEvent{{filepath.Join(dir, "kubelet.sock"), created}}
		}},
		{"a removed file is removed", func(t *testing.T, dir, _ string) []dirEvent {
			p := filepath.Join(dir, "gpu.sock")
			touch(t, p)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			return []dirEvent{{p, created}, {p, removed}}
		}},
		{"a file renamed in is created", func(t *testing.T, dir, other string) []dirEvent {
			src := filepath.Join(other, "kubelet.sock")
			touch(t, src)
			if err := os.Rename(src, filepath.Join(dir, "kubelet.sock")); err != nil {
				t.Fatal(err)
			}
			return []dirEvent{{filepath.Join(dir, "kubelet.sock"), created}}
		}},
		{"a file renamed out is removed", func(t *testing.T, dir, other string) []dirEvent {
			p := filepath.Join(dir, "gpu.sock")
			touch(t, p)
			if err := os.Rename(p, filepath.Join(other, "gpu.sock")); err != nil {
				t.Fatal(err)
			}
			return []dirEvent{{p, created}, {p, removed}}
		}},
		{"a rename within is a removal and a creation", func(t *testing.T, dir, _ string) []dirEvent {
			a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
			touch(t, a)
			if err := os.Rename(a, b); err != nil {
				t.Fatal(err)
			}
			return []dirEvent{{a, created}, {a, removed}, {b, created}}
		}},
		{"a burst larger than the buffer arrives whole", func(t *testing.T, dir, _ string) []dirEvent {
			var want []dirEvent
			for i := range 3 * dirWatchBuffer / 64 {
				p := filepath.Join(dir, "file-with-a-name-long-enough-to-fill-the-buffer-"+string(rune('a'+i%26))+string(rune('a'+i/26)))
				touch(t, p)
				want = append(want, dirEvent{p, created})
			}
			return want
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, other := t.TempDir(), t.TempDir()
			w, err := watchDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			for i, want := range tc.do(t, dir, other) {
				select {
				case got := <-w.Events():
					if got != want {
						t.Fatalf("event %d: got %+v, want %+v", i, got, want)
					}
				case err := <-w.Errors():
					t.Fatalf("event %d: %v", i, err)
				case <-time.After(10 * time.Second):
					t.Fatalf("event %d (%+v) never came", i, want)
				}
			}
		})
	}
}

func TestDirWatchCloseEndsEvents(t *testing.T) {
	dir := t.TempDir()
	w, err := watchDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// An event nobody reads must not keep the goroutine from ending.
	touch(t, filepath.Join(dir, "unread"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for range w.Events() {
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestDirWatchMissingDir(t *testing.T) {
	if _, err := watchDir(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("watching a missing directory: no error")
	}
}

func touch(t *testing.T, p string) {
	t.Helper()
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}
