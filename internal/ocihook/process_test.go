package ocihook_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/ocihook"
)

// cleanChild, as the test binary's first argument, makes it call CleanProcess keeping fd
// 4, then print what it has left: the descriptors not marked close-on-exec (what an exec
// would hand on) and its environment.
const cleanChild = "clean-process-child"

type leftOver struct {
	FDs []int    `json:"fds"`
	Env []string `json:"env"`
}

func cleanProcessChild() {
	if err := ocihook.CleanProcess(os.Args, 4); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var out leftOver
	entries, _ := os.ReadDir("/proc/self/fd")
	for _, e := range entries {
		fd, _ := strconv.Atoi(e.Name())
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			out.FDs = append(out.FDs, fd)
		}
	}
	out.Env = os.Environ()
	json.NewEncoder(os.Stdout).Encode(out)
	os.Exit(0)
}

// TestCleanProcess: a process started with the image's environment, a descriptor it must
// keep and two it must not (a runtime's pipe, a host directory) keeps only the one, and
// runs with the hook's own environment, re-executed.
func TestCleanProcess(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	cmd := exec.Command(self, cleanChild)
	cmd.Env = containerEnv()
	cmd.ExtraFiles = []*os.File{w, r, dir} // fds 3, 4 (kept), 5
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var got leftOver
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if !slices.Equal(got.FDs, []int{0, 1, 2, 4}) {
		t.Errorf("descriptors left without close-on-exec: %v, want [0 1 2 4]", got.FDs)
	}
	if !slices.Equal(got.Env, []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}) {
		t.Errorf("environment %q, want only the hook's PATH", got.Env)
	}
}
