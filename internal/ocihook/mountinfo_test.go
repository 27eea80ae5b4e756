package ocihook

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sampleMountinfo = `22 27 0:21 / /proc rw,relatime - proc proc rw
900 27 0:50 / /run/c/rootfs rw,relatime - overlay overlay rw,lowerdir=/l
901 900 0:51 / /run/c/rootfs/proc rw,nosuid,nodev,noexec,relatime - proc proc rw
902 900 0:52 / /run/c/rootfs/sys ro,nosuid - sysfs sysfs ro
903 902 0:53 / /run/c/rootfs/sys/fs/cgroup ro - cgroup2 cgroup2 rw
904 900 8:1 /lib/libcuda.so.1 /run/c/rootfs/usr/lib64/libcuda.so.1 ro - ext4 /dev/sda1 rw
905 900 0:54 / /run/c/rootfs/my\040dir rw - tmpfs tmpfs rw
906 27 0:55 / /run/c/rootfs-other rw - tmpfs tmpfs rw
`

func TestParseMountinfo(t *testing.T) {
	mounts, err := parseMountinfo(strings.NewReader(sampleMountinfo))
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 8 || mounts[2] != (mount{id: 901, parent: 900, point: "/run/c/rootfs/proc", options: "rw,nosuid,nodev,noexec,relatime", fstype: "proc"}) {
		t.Fatalf("got %+v", mounts)
	}
	if mounts[6].point != "/run/c/rootfs/my dir" {
		t.Errorf("octal escape: %q", mounts[6].point)
	}
	for _, bad := range []string{"1 2 3\n", "22 27 0:21 / /proc rw,relatime proc proc rw\n"} {
		if _, err := parseMountinfo(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestIDMapped(t *testing.T) {
	file := filepath.Join(t.TempDir(), "uid_map")
	if err := os.WriteFile(file, []byte("         0     100000      65536\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[int]bool{0: true, 65534: true, 65535: true, 65536: false, 0x7f000001: false} {
		if got, err := idMapped(file, id); err != nil || got != want {
			t.Errorf("idMapped(%d) = %v, %v; want %v", id, got, err, want)
		}
	}
	if err := os.WriteFile(file, []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := idMapped(file, 0); err == nil {
		t.Error("a malformed map gave no error")
	}
}

func TestSeccompFilterShape(t *testing.T) {
	prog, err := seccompFilter()
	if err != nil {
		t.Skip(err)
	}
	// Every jump must land inside the program, on a return or the prctl block.
	for i, ins := range prog {
		if ins.Jt != 0 && i+1+int(ins.Jt) >= len(prog) {
			t.Errorf("instruction %d jumps past the end", i)
		}
	}
	if len(prog) > 4096 {
		t.Errorf("%d instructions, more than the kernel takes", len(prog))
	}
}
