package ocihook

import (
	"bytes"
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// inMountNamespace runs f on a thread of its own in a private mount namespace, where it
// may mount and chroot: the thread is never unlocked, so it ends with f and takes the
// namespace and the chroot with it.
func inMountNamespace(t *testing.T, f func() error) error {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test needs root, and CI=true")
		}
		t.Skip("needs root")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			errc <- err
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

// rootfsMounts builds, in the calling thread's namespace, a rootfs bound onto itself
// with a volume and a nested one (/data, /data/pvc), the sandbox's two tmpfs (/proc
// writable, /sys read-only) and, when covered, a mount hidden under another (/c/d under
// /c), which no path reaches.
func rootfsMounts(rootfs, volume string, covered bool) error {
	for _, d := range []string{"data", "proc", "sys", "c/d"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return err
		}
	}
	mounts := []struct {
		src, dir, fstype string
		flags            uintptr
	}{
		{rootfs, "", "", unix.MS_BIND | unix.MS_REC},
		{"tmpfs", "data", "tmpfs", 0},
		{"mkdir", "data/pvc", "", 0},
		{volume, "data/pvc", "", unix.MS_BIND},
		{"tmpfs", "proc", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"tmpfs", "sys", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV},
		{"", "sys", "", unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV},
	}
	if covered {
		mounts = append(mounts, struct {
			src, dir, fstype string
			flags            uintptr
		}{"tmpfs", "c/d", "tmpfs", 0}, struct {
			src, dir, fstype string
			flags            uintptr
		}{"tmpfs", "c", "tmpfs", 0})
	}
	for _, m := range mounts {
		target := filepath.Join(rootfs, m.dir)
		if m.src == "mkdir" {
			if err := os.Mkdir(target, 0o755); err != nil {
				return err
			}
			continue
		}
		if err := unix.Mount(m.src, target, m.fstype, m.flags, ""); err != nil {
			return err
		}
	}
	return nil
}

// TestRestrictRootfs: both ways of restricting the rootfs leave every mount read-only,
// nosuid, nodev and noexec but the sandbox's two tmpfs, and the check after them fails
// closed on a mount the remount fallback cannot reach by path.
func TestRestrictRootfs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		covered  bool
		restrict func(mountinfo *os.File, rootfs string) error
		wantErr  string
	}{
		{name: "mount_setattr", restrict: restrictRootfs},
		{name: "mount_setattr reaches a covered mount", covered: true, restrict: restrictRootfs},
		{name: "remount fallback", restrict: remountThenCheck},
		{name: "remount fallback fails closed on a covered mount", covered: true, restrict: remountThenCheck, wantErr: "/c/d ("},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rootfs, volume := filepath.Join(t.TempDir(), "rootfs"), t.TempDir()
			err := inMountNamespace(t, func() error {
				if err := rootfsMounts(rootfs, volume, tc.covered); err != nil {
					return err
				}
				mountinfo, err := os.Open("/proc/thread-self/mountinfo")
				if err != nil {
					return err
				}
				defer mountinfo.Close()
				if err := unix.Chroot(rootfs); err != nil {
					return err
				}
				if err := unix.Chdir("/"); err != nil {
					return err
				}
				if err := tc.restrict(mountinfo, rootfs); err != nil {
					return err
				}
				for path, want := range map[string]error{
					"/data/x": unix.EROFS, "/data/pvc/x": unix.EROFS, "/x": unix.EROFS, "/sys/x": unix.EROFS, "/proc/x": nil,
				} {
					fd, err := unix.Open(path, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
					if err == nil {
						unix.Close(fd)
					}
					if !errors.Is(err, want) && err != want {
						return errors.New("creating " + path + ": " + errString(err) + ", want " + errString(want))
					}
				}
				return nil
			})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
			}
		})
	}
}

func remountThenCheck(mountinfo *os.File, rootfs string) error {
	if err := remountAll(mountinfo, rootfs); err != nil {
		return err
	}
	return checkRestricted(mountinfo, rootfs)
}

func errString(err error) string {
	if err == nil {
		return "success"
	}
	return err.Error()
}

// TestCheckELF: only a static executable for the hook's own machine is run.
func TestCheckELF(t *testing.T) {
	ldconfig, err := os.ReadFile("/sbin/ldconfig") // glibc's: static
	if err != nil {
		t.Skip("no /sbin/ldconfig:", err)
	}
	dynamic, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	otherMachine := bytes.Clone(ldconfig)
	otherMachine[18] ^= 0x40 // e_machine, low byte
	class32 := bytes.Clone(ldconfig)
	class32[elf.EI_CLASS] = byte(elf.ELFCLASS32)
	for _, tc := range []struct {
		name, want string
		data       []byte
	}{
		{"static, this machine", "", ldconfig},
		{"a script", "not an ELF executable", []byte("#!/bin/sh\nexec /bin/ldconfig.real \"$@\"\n")},
		{"dynamic", "dynamically linked", dynamic},
		{"another machine", "is built for", otherMachine},
		{"32-bit", "", class32}, // unreadable as 64-bit, or refused for its class
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkELF(tc.data)
			if tc.name == "32-bit" {
				if err == nil {
					t.Fatal("a 32-bit header was accepted")
				}
				return
			}
			if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkELF: %v, want %q", err, tc.want)
			}
		})
	}
}
