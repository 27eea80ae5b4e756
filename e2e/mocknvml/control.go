package mocknvml

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultTimeout bounds how long Inject waits for the library to apply a command.
const DefaultTimeout = 10 * time.Second

var (
	// ErrRejected means the library read the command and refused it (a
	// typo, or a GPU index the profile does not have).
	ErrRejected = errors.New("mock NVML rejected the command")
	// ErrNoReply means no library answered in time: no process has it
	// initialised with MOCK_NVML_CONTROL naming this FIFO.
	ErrNoReply = errors.New("no reply from mock NVML")
)

// Control injects faults into a mock library through its control FIFO (the
// path in the library's MOCK_NVML_CONTROL). Commands, one a line:
//
//	xid <index> <code> [<gi> [<ci>]]
//	                             XID event, data <code>; with gi (and ci) it is
//	                             that MIG instance's, still on the parent GPU
//	ecc <index> [double|single]  ECC event, double-bit unless told
//	temp <index> <celsius>       current temperature
//	throttle <index> <hex>       current clocks event reasons
//	lost <index>                 calls on the GPU fail GPU_IS_LOST; XID 79 event
//	recover <index>              clears lost, temp, throttle, recovery, remap and
//	                             transient to the profile's
//	recovery <index> <action>    recovery-action field: none reset reboot drain
//	                             drain-and-reset; a recovery-action event
//	remap <index> <state>        remapped rows: none, pending or failure
//	transient <index> <calls>    the next <calls> calls on the GPU fail UNKNOWN
//	fail, unfail                 every call on any GPU fails UNKNOWN, or stops
//	mig-create-pause <index> [before|after]
//	                             the next compute instance creation on the GPU
//	                             stops until resumed (PauseMIGCreate)
//	mig-create-resume <index>    lets it go on (ResumeMIGCreate)
//	mig-create-wait <index> [<ms>]
//	                             answers once one is stopped (WaitMIGCreatePaused)
//	mig-create-fail <index> [any|gi|ci]
//	                             the next creation fails INSUFFICIENT_RESOURCES
//	procs <index> [<pid>[:<MiB>],...]
//	                             the compute processes the GPU lists (none
//	                             without a list); graphics-procs the same for
//	                             graphics ones. A process keeps removal IN_USE
//	persistence <index> on|off   persistence mode: drain and removal IN_USE
//	resetfail <index> [any|remove|discover]
//	                             the next removal or rediscovery of the GPU
//	                             fails UNKNOWN and changes nothing
//	comebackbroken <index> [<action>]
//	                             the next rediscovery leaves recovery action
//	                             <action> (default reset) set
//	unprivileged, privileged     drain, removal and rediscovery answer
//	                             NO_PERMISSION, as to a caller without root
//
// Inject returns once the library has applied the command: Control prefixes
// each line with an id ("@7 xid 3 79") and reads the library's answer from
// a second FIFO, <path>.reply. A command sent while no library reads the
// FIFO waits there, and is applied at the next nvmlInit even if Inject gave
// up. Use one Control per FIFO; its methods are safe for concurrent use.
type Control struct {
	path string

	mu    sync.Mutex // serialises commands so replies pair with them
	cmd   *os.File
	reply *os.File
	r     *bufio.Reader
	seq   uint64
}

// OpenControl opens the control FIFO at path and its reply FIFO, making
// either when missing. The library need not be running yet.
func OpenControl(path string) (*Control, error) {
	for _, p := range []string{path, path + ".reply"} {
		if err := makeFIFO(p); err != nil {
			return nil, fmt.Errorf("opening mock NVML control: %w", err)
		}
	}
	// Read-write on both, so neither open waits for the other end and the
	// FIFOs stay open while the library comes and goes.
	cmd, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("opening mock NVML control: %w", err)
	}
	reply, err := os.OpenFile(path+".reply", os.O_RDWR, 0)
	if err != nil {
		cmd.Close()
		return nil, fmt.Errorf("opening mock NVML control: %w", err)
	}
	return &Control{path: path, cmd: cmd, reply: reply, r: bufio.NewReader(reply)}, nil
}

func makeFIFO(path string) error {
	err := syscall.Mkfifo(path, 0o600)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return &fs.PathError{Op: "mkfifo", Path: path, Err: err}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeNamedPipe == 0 {
		return fmt.Errorf("%s exists and is not a FIFO (remove it, or pick another MOCK_NVML_CONTROL)", path)
	}
	return nil
}

// Path is the control FIFO's path, the value for MOCK_NVML_CONTROL.
func (c *Control) Path() string { return c.path }

// Inject sends one command and waits up to DefaultTimeout for the library to
// apply it.
func (c *Control) Inject(line string) error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	return c.InjectContext(ctx, line)
}

// InjectContext sends one command and waits until the library has applied it
// or ctx ends. The error wraps ErrRejected or ErrNoReply.
func (c *Control) InjectContext(ctx context.Context, line string) error {
	line = strings.TrimSpace(line)
	if line == "" || strings.ContainsAny(line, "\n@") {
		return fmt.Errorf("injecting %q: %w: a command is one line without @", line, ErrRejected)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	id := fmt.Sprintf("@%d", c.seq)
	if _, err := c.cmd.WriteString(id + " " + line + "\n"); err != nil {
		return fmt.Errorf("injecting %q: %w", line, err)
	}

	deadline, _ := ctx.Deadline() // zero: no deadline
	if err := c.reply.SetReadDeadline(deadline); err != nil {
		return fmt.Errorf("injecting %q: %w", line, err)
	}
	stop := context.AfterFunc(ctx, func() { c.reply.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	for {
		s, err := c.r.ReadString('\n')
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return fmt.Errorf("injecting %q: %w: is a process between nvmlInit and nvmlShutdown with MOCK_NVML_CONTROL=%s?", line, ErrNoReply, c.path)
			}
			return fmt.Errorf("injecting %q: reading reply: %w", line, err)
		}
		got, msg, _ := strings.Cut(strings.TrimSuffix(s, "\n"), " ")
		if got != id {
			continue // the answer to an earlier command that gave up waiting
		}
		if msg == "ok" {
			return nil
		}
		return fmt.Errorf("injecting %q: %w: %s", line, ErrRejected, strings.TrimPrefix(msg, "error: "))
	}
}

// Close closes the FIFOs; it leaves them on disk.
func (c *Control) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return errors.Join(c.cmd.Close(), c.reply.Close())
}

// MIGPause is where a compute instance creation stopped by PauseMIGCreate
// waits.
type MIGPause string

const (
	// MIGPauseBefore stops nvmlGpuInstanceCreateComputeInstance as it
	// starts: the GPU instance exists, its compute instance does not yet.
	// A plugin killed there leaves a GPU instance without a MIG device.
	MIGPauseBefore MIGPause = "before"
	// MIGPauseAfter stops it once the compute instance exists (in the
	// state file and the capability files too) and before the call
	// returns: a plugin killed there leaves a whole MIG device it never
	// heard of.
	MIGPauseAfter MIGPause = "after"
)

// PauseMIGCreate makes the next nvmlGpuInstanceCreateComputeInstance (or
// ...WithPlacement) on GPU gpu stop at at until ResumeMIGCreate (or
// "recover <gpu>"), so a test can kill the caller between creating an
// instance and recording it. Only that call waits; every other call goes on.
func (c *Control) PauseMIGCreate(gpu int, at MIGPause) error {
	return c.Inject(fmt.Sprintf("mig-create-pause %d %s", gpu, at))
}

// WaitMIGCreatePaused returns once a creation on GPU gpu is stopped by
// PauseMIGCreate, or fails when none is by the time ctx ends (10 seconds
// without a deadline). The library's control thread waits meanwhile, so
// other commands wait behind it.
func (c *Control) WaitMIGCreatePaused(ctx context.Context, gpu int) error {
	return c.waitPaused(ctx, "mig-create-wait", gpu)
}

// ResumeMIGCreate lets a creation stopped on GPU gpu go on, and disarms a
// pause not reached yet.
func (c *Control) ResumeMIGCreate(gpu int) error {
	return c.Inject(fmt.Sprintf("mig-create-resume %d", gpu))
}

// MIGCreation names which creations FailMIGCreate fails.
type MIGCreation string

const (
	MIGCreateAny             MIGCreation = "any" // the next GPU or compute instance creation
	MIGCreateGPUInstance     MIGCreation = "gi"  // the next nvmlDeviceCreateGpuInstance(WithPlacement)
	MIGCreateComputeInstance MIGCreation = "ci"  // the next nvmlGpuInstanceCreateComputeInstance(WithPlacement)
)

// FailMIGCreate makes the next creation of that kind on GPU gpu answer
// INSUFFICIENT_RESOURCES, creating nothing, as a driver that found no room.
func (c *Control) FailMIGCreate(gpu int, what MIGCreation) error {
	return c.Inject(fmt.Sprintf("mig-create-fail %d %s", gpu, what))
}

// ResetStep is the step of a reset PauseReset stops.
type ResetStep string

const (
	// ResetPauseRemove stops nvmlDeviceRemoveGpu(_v2) as it starts, after
	// its arguments are checked: the GPU is draining, not removed yet. It
	// goes on from its checks when resumed (a process listed meanwhile
	// makes it IN_USE). A caller killed there leaves the GPU draining.
	ResetPauseRemove ResetStep = "remove"
	// ResetPauseDiscover stops nvmlDeviceDiscoverGpus before it brings the
	// GPU back: the GPU is removed. A caller killed there leaves it
	// removed.
	ResetPauseDiscover ResetStep = "discover"
)

// PauseReset makes the next removal (ResetPauseRemove) or rediscovery
// (ResetPauseDiscover) of GPU gpu stop until ResumeReset (or "recover
// <gpu>"), so a test can act, or kill the caller, in the middle of a
// reset. Only that call waits; every other call goes on.
func (c *Control) PauseReset(gpu int, at ResetStep) error {
	return c.Inject(fmt.Sprintf("reset-pause %d %s", gpu, at))
}

// WaitResetPaused returns once a removal or rediscovery of GPU gpu is
// stopped by PauseReset, or fails when none is by the time ctx ends (10
// seconds without a deadline). The library's control thread waits
// meanwhile, so other commands wait behind it.
func (c *Control) WaitResetPaused(ctx context.Context, gpu int) error {
	return c.waitPaused(ctx, "reset-wait", gpu)
}

// waitPaused sends verb for GPU gpu with the time left to wait, which the
// library bounds itself: ctx's deadline, else DefaultTimeout.
func (c *Control) waitPaused(ctx context.Context, verb string, gpu int) error {
	ms := DefaultTimeout.Milliseconds()
	if d, ok := ctx.Deadline(); ok {
		ms = max(time.Until(d).Milliseconds(), 1)
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout+time.Second) // the library answers first
		defer cancel()
	}
	return c.InjectContext(ctx, fmt.Sprintf("%s %d %d", verb, gpu, ms))
}

// ResumeReset lets a removal or rediscovery stopped on GPU gpu go on, and
// disarms a pause not reached yet.
func (c *Control) ResumeReset(gpu int) error {
	return c.Inject(fmt.Sprintf("reset-resume %d", gpu))
}
