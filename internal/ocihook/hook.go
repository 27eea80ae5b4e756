package ocihook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Name is the executable's file name: what install writes and what CDI specs run.
const Name = "gpu-device-plugin-cdi-hook"

const (
	// The sandbox as a whole, and the image's ldconfig inside it. The second is shorter so
	// that a hanging ldconfig is reported and skipped rather than failing the container.
	sandboxTimeout  = 30 * time.Second
	ldconfigTimeout = 20 * time.Second

	// How much of the sandbox's output reaches the runtime: the image's ldconfig writes
	// there too, and runtimes buffer hook output in memory.
	maxRelay = 64 << 10

	cleanPath = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"
)

// CreateContainer is the hook proper, as the runtime runs it: it reads the OCI state on
// stdin, finds the container's rootfs and does req inside it, in a sandbox (see Sandbox).
// It fails only when it cannot do its job at all (bad state, no rootfs, no sandbox);
// what goes wrong inside the container is reported on stderr and is not an error.
func CreateContainer(ctx context.Context, req Request, stdin io.Reader, stderr io.Writer) error {
	st, err := ReadState(stdin)
	if err != nil {
		return err
	}
	rootfs, err := RootFS(st.Bundle)
	if err != nil {
		return fmt.Errorf("container %s: %w", st.ID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, sandboxTimeout)
	defer cancel()
	// /proc/self/exe is this very binary, even if install has replaced the file since.
	cmd := exec.CommandContext(ctx, "/proc/self/exe", append([]string{"sandbox", "--rootfs", rootfs}, req.Args()...)...)
	cmd.Args[0] = Name
	cmd.Env = []string{cleanPath}
	out := &limitWriter{w: stderr, n: maxRelay}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// NEWNS keeps the sandbox's chroot and mounts to itself; NEWPID makes it the init
		// of a namespace, so that everything it starts dies with it.
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC |
			syscall.CLONE_NEWUTS | syscall.CLONE_NEWNET,
		Pdeathsig: syscall.SIGKILL,
	}
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == ExitRefused {
			return ErrRefused
		}
		if ctx.Err() != nil {
			return fmt.Errorf("container %s: sandbox did not finish within %s: %w", st.ID, sandboxTimeout, err)
		}
		return fmt.Errorf("container %s: sandbox: %w", st.ID, err)
	}
	return nil
}

// Install copies the running executable to dir/Name, creating dir. The copy is written
// to a temporary file and renamed into place, so a runtime starting the hook at the same
// time runs either the old or the new copy, never a partial one.
func Install(dir string) error {
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("opening own executable: %w", err)
	}
	defer self.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating install directory: %w", err)
	}
	d, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("opening install directory: %w", err)
	}
	defer d.Close()
	if err := writeFileAt(d, Name, 0o755, self); err != nil {
		return fmt.Errorf("installing %s in %s: %w", Name, dir, err)
	}
	return nil
}

// limitWriter passes on the first n bytes and drops the rest, saying so once.
type limitWriter struct {
	w   io.Writer
	n   int
	cut bool
}

func (l *limitWriter) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) > l.n {
		p = p[:l.n]
		if !l.cut {
			l.cut = true
			defer fmt.Fprintf(l.w, "\n%s: output longer than %d bytes; the rest was dropped\n", Name, maxRelay)
		}
	}
	l.n -= len(p)
	if _, err := l.w.Write(p); err != nil {
		return 0, err
	}
	return n, nil
}
