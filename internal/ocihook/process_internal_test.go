package ocihook

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCloseFrom3 marks a descriptor opened without O_CLOEXEC close-on-exec, through
// close_range and through the /proc/self/fd fallback.
func TestCloseFrom3(t *testing.T) {
	fdDir, err := os.Open("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	defer fdDir.Close()
	for _, tc := range []struct {
		name string
		mark func() error
	}{
		{"close_range", func() error { return closeFrom3(fdDir) }},
		{"proc fallback", func() error { return cloexecListed(fdDir) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd, err := unix.Open(os.DevNull, unix.O_RDONLY, 0) // no O_CLOEXEC
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			if err := tc.mark(); err != nil {
				t.Fatal(err)
			}
			if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
				t.Errorf("fd %d: flags %#x, %v; want FD_CLOEXEC", fd, flags, err)
			}
		})
	}
}
