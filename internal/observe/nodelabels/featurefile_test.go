package nodelabels

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFeatureFileSync(t *testing.T) {
	dir := t.TempDir()
	f := FeatureFile{Path: filepath.Join(dir, "features.d", FileName), Expiry: time.Hour}
	now := time.Date(2026, 11, 27, 7, 0, 0, 0, time.UTC)
	labels := map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}

	wrote, err := f.Sync(labels, now)
	if err != nil || !wrote {
		t.Fatalf("first sync: wrote %v, %v", wrote, err)
	}
	b, err := os.ReadFile(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	want := "# +expiry-time=2026-11-27T08:00:00Z\nnvidia.com/gpu.count=8\nnvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\n"
	if !strings.HasSuffix(string(b), want) || !strings.HasPrefix(string(b), "# ") {
		t.Errorf("file:\n%s\nwant it to end with\n%s", b, want)
	}

	// At rest nothing is written until half the expiry is gone.
	for _, at := range []time.Duration{time.Minute, 29 * time.Minute} {
		if wrote, err := f.Sync(labels, now.Add(at)); err != nil || wrote {
			t.Errorf("sync at rest after %v: wrote %v, %v", at, wrote, err)
		}
	}
	if wrote, err := f.Sync(labels, now.Add(31*time.Minute)); err != nil || !wrote {
		t.Errorf("refresh after 31m: wrote %v, %v", wrote, err)
	}
	// A change is written at once.
	labels["nvidia.com/gpu.count"] = "7"
	if wrote, err := f.Sync(labels, now.Add(32*time.Minute)); err != nil || !wrote {
		t.Errorf("changed labels: wrote %v, %v", wrote, err)
	}
	got, _, err := read(f.Path)
	if err != nil || got["nvidia.com/gpu.count"] != "7" {
		t.Errorf("read back %v, %v", got, err)
	}
	// Only our file is in features.d: the temporary ones are gone.
	entries, _ := os.ReadDir(filepath.Dir(f.Path))
	if len(entries) != 1 {
		t.Errorf("features.d holds %d files", len(entries))
	}
	if err := f.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(); err != nil {
		t.Errorf("removing twice: %v", err)
	}
}

func TestFeatureFileWithoutExpiry(t *testing.T) {
	f := FeatureFile{Path: filepath.Join(t.TempDir(), FileName)}
	now := time.Now()
	labels := map[string]string{"nvidia.com/gpu.count": "1"}
	if wrote, err := f.Sync(labels, now); err != nil || !wrote {
		t.Fatalf("first sync: %v, %v", wrote, err)
	}
	if wrote, err := f.Sync(labels, now.Add(1000*time.Hour)); err != nil || wrote {
		t.Errorf("no expiry: rewrote at rest (%v, %v)", wrote, err)
	}
	b, _ := os.ReadFile(f.Path)
	if strings.Contains(string(b), "expiry") {
		t.Errorf("an expiry without one asked:\n%s", b)
	}
}

// A file someone broke is replaced, not trusted.
func TestFeatureFileReplacesGarbage(t *testing.T) {
	f := FeatureFile{Path: filepath.Join(t.TempDir(), FileName), Expiry: time.Hour}
	if err := os.WriteFile(f.Path, []byte("# +expiry-time=yesterday\nnvidia.com/gpu.count=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if wrote, err := f.Sync(map[string]string{"nvidia.com/gpu.count": "1"}, time.Now()); err != nil || !wrote {
		t.Errorf("sync over a bad expiry: %v, %v", wrote, err)
	}
}
