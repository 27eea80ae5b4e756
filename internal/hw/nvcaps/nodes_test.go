package nvcaps

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const devices = "Character devices:\n  1 mem\n195 nvidia\n237 nvidia-caps\n\nBlock devices:\n  8 sd\n"

func TestEnsureNodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	proc, dev := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(proc, "devices"), []byte(devices), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := EnsureNodes(dev, proc, []int{30, 31}); err != nil {
		t.Fatal(err)
	}
	for _, minor := range []uint32{30, 31} {
		var st unix.Stat_t
		p := filepath.Join(dev, "nvidia-caps", fmt.Sprintf("nvidia-cap%d", minor))
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(uint64(st.Rdev)) != 237 || unix.Minor(uint64(st.Rdev)) != minor || st.Mode&0o777 != accessMode {
			t.Errorf("%s: mode %o, %d:%d; want a 0444 character device 237:%d", p, st.Mode, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), minor)
		}
	}
	// Present nodes are kept; a file in the way is an error.
	if err := EnsureNodes(dev, proc, []int{30}); err != nil {
		t.Errorf("again: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dev, "nvidia-caps", "nvidia-cap32"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := EnsureNodes(dev, proc, []int{32}); err == nil || !strings.Contains(err.Error(), "not a character device") {
		t.Errorf("a regular file in the way: %v", err)
	}
}

func TestCapsMajorErrors(t *testing.T) {
	proc := t.TempDir()
	if _, err := capsMajor(proc); err == nil || !strings.Contains(err.Error(), "nvidia-caps major") {
		t.Errorf("no devices file: %v", err)
	}
	// Only character devices count.
	if err := os.WriteFile(filepath.Join(proc, "devices"), []byte("Character devices:\n195 nvidia\n\nBlock devices:\n237 nvidia-caps\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := capsMajor(proc); err == nil || !strings.Contains(err.Error(), "lists no nvidia-caps") {
		t.Errorf("a block device of that name: %v", err)
	}
	if err := os.WriteFile(filepath.Join(proc, "devices"), []byte(devices), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, err := capsMajor(proc); err != nil || m != 237 {
		t.Errorf("capsMajor = %d, %v; want 237", m, err)
	}
}
