package imex

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// gb200Devices is /proc/devices as an R570 driver with IMEX support shows it.
const gb200Devices = "Character devices:\n  1 mem\n195 nvidia\n234 nvidia-caps-imex-channels\n235 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n  8 sd\n"

func writeDevices(t *testing.T, content string) string {
	t.Helper()
	proc := t.TempDir()
	if err := os.WriteFile(filepath.Join(proc, "devices"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return proc
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mknod of a character device needs root (CAP_MKNOD); run the test as root to cover EnsureChannel")
	}
}

func TestPath(t *testing.T) {
	if got := Path(7); got != "/dev/nvidia-caps-imex-channels/channel7" {
		t.Errorf("Path(7) = %q", got)
	}
}

func TestMajor(t *testing.T) {
	tests := []struct {
		name    string
		devices string
		want    uint32
		ok      bool
		wantErr string
	}{
		{name: "listed", devices: gb200Devices, want: 234, ok: true},
		{name: "driver without IMEX", devices: "Character devices:\n195 nvidia\n235 nvidia-caps\n", ok: false},
		{name: "block device of that name does not count", devices: "Character devices:\n195 nvidia\n\nBlock devices:\n234 nvidia-caps-imex-channels\n", ok: false},
		{name: "nvidia-caps alone is not it", devices: "Character devices:\n235 nvidia-caps\n", ok: false},
		{name: "malformed major", devices: "Character devices:\nx nvidia-caps-imex-channels\n", wantErr: `major "x" is not a number`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := Major(writeDevices(t, tt.devices))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Major = %d, %t, %v; want an error with %q", got, ok, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want || ok != tt.ok {
				t.Errorf("Major = %d, %t, %v; want %d, %t", got, ok, err, tt.want, tt.ok)
			}
		})
	}
	if _, _, err := Major(t.TempDir()); err == nil || !strings.Contains(err.Error(), "nvidia-caps-imex-channels major") {
		t.Errorf("no devices file: %v", err)
	}
}

func TestEnsureChannel(t *testing.T) {
	needRoot(t)
	dev := t.TempDir()
	old := unix.Umask(0o022)
	defer unix.Umask(old)
	for _, id := range []int{0, 5} {
		path, err := EnsureChannel(dev, 234, id)
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(dev, "nvidia-caps-imex-channels", "channel"+strconv.Itoa(id)); path != want {
			t.Errorf("path %q, want %q", path, want)
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 234 || unix.Minor(st.Rdev) != uint32(id) || st.Mode&0o7777 != Mode {
			t.Errorf("%s: mode %o, %d:%d; want a 0666 character device 234:%d", path, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), id)
		}
	}
	// Idempotent: a second call keeps the node.
	if _, err := EnsureChannel(dev, 234, 0); err != nil {
		t.Errorf("again: %v", err)
	}
	got, err := Channels(dev)
	if err != nil || !reflect.DeepEqual(got, []int{0, 5}) {
		t.Errorf("Channels = %v, %v; want [0 5]", got, err)
	}
}

func TestEnsureChannelRefuses(t *testing.T) {
	needRoot(t)
	t.Run("wrong major in the way", func(t *testing.T) {
		dev := t.TempDir()
		if _, err := EnsureChannel(dev, 234, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := EnsureChannel(dev, 240, 0); err == nil || !strings.Contains(err.Error(), "is not IMEX channel 0") {
			t.Errorf("a node of another major: %v", err)
		}
	})
	t.Run("regular file in the way", func(t *testing.T) {
		dev := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dev, DeviceName), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dev, DeviceName, "channel1"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := EnsureChannel(dev, 234, 1); err == nil || !strings.Contains(err.Error(), "remove it") {
			t.Errorf("a file in the way: %v", err)
		}
	})
	t.Run("symbolic link as the channel is not followed", func(t *testing.T) {
		dev, elsewhere := t.TempDir(), t.TempDir()
		if err := os.MkdirAll(filepath.Join(dev, DeviceName), 0o755); err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(elsewhere, "planted")
		if err := os.Symlink(target, filepath.Join(dev, DeviceName, "channel0")); err != nil {
			t.Fatal(err)
		}
		if _, err := EnsureChannel(dev, 234, 0); err == nil || !strings.Contains(err.Error(), "is not IMEX channel 0") {
			t.Errorf("a link in the way: %v", err)
		}
		if _, err := os.Lstat(target); !os.IsNotExist(err) {
			t.Errorf("a node was made through the link at %s: %v", target, err)
		}
	})
	t.Run("symbolic link as the directory is not followed", func(t *testing.T) {
		dev, elsewhere := t.TempDir(), t.TempDir()
		if err := os.Symlink(elsewhere, filepath.Join(dev, DeviceName)); err != nil {
			t.Fatal(err)
		}
		if _, err := EnsureChannel(dev, 234, 0); err == nil || !strings.Contains(err.Error(), "is not a directory") {
			t.Errorf("a linked directory: %v", err)
		}
		if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
			t.Errorf("a node was made through the linked directory: %v", entries)
		}
	})
	t.Run("bad arguments", func(t *testing.T) {
		dev := t.TempDir()
		if _, err := EnsureChannel(dev, 234, MaxChannel+1); err == nil || !strings.Contains(err.Error(), "0 to 2047") {
			t.Errorf("channel out of range: %v", err)
		}
		if _, err := EnsureChannel(dev, 0, 0); err == nil || !strings.Contains(err.Error(), "major number 0") {
			t.Errorf("major 0: %v", err)
		}
	})
}

func TestChannels(t *testing.T) {
	dev := t.TempDir()
	if got, err := Channels(dev); err != nil || got != nil {
		t.Errorf("no directory: %v, %v; want none", got, err)
	}
	dir := filepath.Join(dev, DeviceName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Regular files, odd names and leading zeros are not channels.
	for _, name := range []string{"channel3", "channel03", "channelx", "other"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := Channels(dev); err != nil || got != nil {
		t.Errorf("regular files only: %v, %v; want none", got, err)
	}
	if os.Geteuid() != 0 {
		return
	}
	for _, id := range []int{12, 2} {
		if _, err := EnsureChannel(dev, 234, id); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := Channels(dev); err != nil || !reflect.DeepEqual(got, []int{2, 12}) {
		t.Errorf("Channels = %v, %v; want [2 12]", got, err)
	}
}

// IsChannel makes nothing and agrees with EnsureChannel: missing is
// false, the node EnsureChannel made is true, whatever EnsureChannel
// refuses is an error.
func TestIsChannel(t *testing.T) {
	t.Run("missing: false, nothing made", func(t *testing.T) {
		dev := t.TempDir()
		if ok, err := IsChannel(dev, 234, 0); ok || err != nil {
			t.Errorf("no directory: %v, %v; want false, nil", ok, err)
		}
		if err := os.Mkdir(filepath.Join(dev, DeviceName), 0o755); err != nil {
			t.Fatal(err)
		}
		if ok, err := IsChannel(dev, 234, 0); ok || err != nil {
			t.Errorf("no node: %v, %v; want false, nil", ok, err)
		}
		if entries, _ := os.ReadDir(filepath.Join(dev, DeviceName)); len(entries) != 0 {
			t.Errorf("IsChannel made %v", entries)
		}
	})
	t.Run("in the way: the error EnsureChannel gives", func(t *testing.T) {
		dev, elsewhere := t.TempDir(), t.TempDir()
		if err := os.Symlink(elsewhere, filepath.Join(dev, DeviceName)); err != nil {
			t.Fatal(err)
		}
		if _, err := IsChannel(dev, 234, 0); err == nil || !strings.Contains(err.Error(), "is not a directory") {
			t.Errorf("a linked directory: %v", err)
		}
		dev = t.TempDir()
		if err := os.MkdirAll(filepath.Join(dev, DeviceName), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dev, DeviceName, "channel1"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := IsChannel(dev, 234, 1); err == nil || !strings.Contains(err.Error(), "is not IMEX channel 1") {
			t.Errorf("a file in the way: %v", err)
		}
		if _, err := IsChannel(dev, 234, MaxChannel+1); err == nil || !strings.Contains(err.Error(), "0 to 2047") {
			t.Errorf("channel out of range: %v", err)
		}
	})
	t.Run("the node EnsureChannel made: true; another major's: an error", func(t *testing.T) {
		needRoot(t)
		dev := t.TempDir()
		if _, err := EnsureChannel(dev, 234, 0); err != nil {
			t.Fatal(err)
		}
		if ok, err := IsChannel(dev, 234, 0); !ok || err != nil {
			t.Errorf("made: %v, %v; want true, nil", ok, err)
		}
		if _, err := IsChannel(dev, 240, 0); err == nil || !strings.Contains(err.Error(), "is not IMEX channel 0") {
			t.Errorf("another major: %v", err)
		}
	})
}
