package cudaprobe

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/cuda"
)

const (
	// HelperCommand is the hidden subcommand of our own executable that
	// runs Main.
	HelperCommand = "cuda-probe"
	// DefaultTimeout bounds a probe when Options.Timeout is 0. A healthy
	// GPU answers in well under a second, or a few with a cold driver.
	DefaultTimeout = 30 * time.Second
)

// reapGrace is how long Run waits, after killing the probe, for the kernel
// to let it go. A process stuck in the driver cannot die until the driver
// returns; Run does not wait for that.
var reapGrace = 5 * time.Second

// Options are one probe of one GPU.
type Options struct {
	// Self is this executable (os.Executable()), which has the hidden
	// HelperCommand.
	Self string
	// DriverRoot is where libcuda.so.1 is looked for (cuda.LibraryPath),
	// as this process sees it; "": "/".
	DriverRoot string
	// DevRoot and SysRoot are the /dev and /sys the GPU's nodes and the
	// sysfs come from; "": /dev and /sys.
	DevRoot string
	SysRoot string
	// PCIBusID and UUID name the GPU (cuda.Target): at least one. Minor is
	// its /dev/nvidia<Minor>, the only GPU node the probe sees.
	PCIBusID string
	UUID     string
	Minor    int
	// AllocBytes, if not 0, are allocated in the context and freed.
	AllocBytes uint64
	// Timeout bounds the whole probe; 0: DefaultTimeout.
	Timeout time.Duration
}

// Run probes one GPU in a confined process (see the package doc) and
// returns what it found. A GPU that fails a step, hangs (killed at
// Timeout) or crashes the probe is a Result with OK false and a nil
// error. The error is set only when the probe could not judge the GPU:
// bad options, no libcuda.so.1, a process or confinement that could not be
// set up, or ctx done before Timeout; the Result then says what it knows.
func Run(ctx context.Context, o Options) (cuda.Result, error) {
	args, err := o.helperArgs()
	if err != nil {
		return cuda.Result{Step: cuda.StepLoad, Message: err.Error()}, fmt.Errorf("cuda probe of %s: %w", o.name(), err)
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	r, err := run(ctx, o.Self, args, timeout)
	if err != nil {
		return r, fmt.Errorf("cuda probe of %s: %w", o.name(), err)
	}
	return r, nil
}

// name is the GPU as errors name it.
func (o Options) name() string {
	if o.UUID != "" {
		return o.UUID
	}
	return o.PCIBusID
}

// helperArgs are the helper's arguments: flags Main parses.
func (o Options) helperArgs() ([]string, error) {
	switch {
	case !filepath.IsAbs(o.Self):
		return nil, fmt.Errorf("the plugin's executable %q is not an absolute path", o.Self)
	case o.PCIBusID == "" && o.UUID == "":
		return nil, errors.New("no PCI bus ID or UUID: name the GPU to probe")
	case o.Minor < 0:
		return nil, fmt.Errorf("minor number %d: want the GPU's /dev/nvidia<minor>", o.Minor)
	}
	lib, err := cuda.LibraryPath(o.DriverRoot)
	if err != nil {
		return nil, err
	}
	return []string{
		HelperCommand,
		"--library=" + lib,
		"--dev-root=" + orDefault(o.DevRoot, "/dev"),
		"--sys-root=" + orDefault(o.SysRoot, "/sys"),
		"--minor=" + strconv.Itoa(o.Minor),
		"--pci-bus-id=" + o.PCIBusID,
		"--uuid=" + o.UUID,
		"--alloc-bytes=" + strconv.FormatUint(o.AllocBytes, 10),
	}, nil
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// helperEnv is the probe's whole environment. No CUDA_VISIBLE_DEVICES:
// the device nodes choose the GPU.
var helperEnv = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}

// run starts self with args confined, reads its report and kills it at
// timeout.
func run(ctx context.Context, self string, args []string, timeout time.Duration) (cuda.Result, error) {
	start := time.Now()
	cmd := exec.Command(self, args...)
	cmd.Env, cmd.Dir = helperEnv, "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// PID 1 of a namespace of its own: when it dies, the kernel kills
		// everything it started.
		Cloneflags: syscall.CLONE_NEWPID,
		// With CLONE_NEWNS here, Go also makes / recursively private in
		// the child before it execs, so no mount of the probe propagates.
		Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS | syscall.CLONE_NEWNET,
		Setpgid:      true,
		Pdeathsig:    syscall.SIGKILL,
	}
	stdout, stdoutW, err := os.Pipe()
	if err != nil {
		return cuda.Result{}, err
	}
	defer stdout.Close()
	stderr, stderrW, err := os.Pipe()
	if err != nil {
		stdoutW.Close()
		return cuda.Result{}, err
	}
	defer stderr.Close()
	// Files, not io.Writers, so exec starts no copying goroutine that a
	// child stuck in the driver would hold.
	cmd.Stdout, cmd.Stderr = stdoutW, stderrW
	err = cmd.Start()
	// Only the child holds the write ends now.
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		return cuda.Result{}, fmt.Errorf("starting %s %s: %w", self, HelperCommand, err)
	}

	rep := newReport()
	read := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); rep.readStdout(stdout) }()
		go func() { defer wg.Done(); rep.readStderr(stderr) }()
		wg.Wait()
		close(read)
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var waitErr, killedFor error // killedFor: errTimedOut, or ctx's error
	stuck := false
	select {
	case waitErr = <-exited:
	case <-timer.C:
		killedFor = errTimedOut
	case <-ctx.Done():
		killedFor = ctx.Err()
	}
	grace := time.NewTimer(reapGrace)
	defer grace.Stop()
	if killedFor != nil {
		// The whole group; and with PID 1 gone, the kernel ends the rest of
		// its namespace.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case waitErr = <-exited:
		case <-grace.C:
			// Stuck in the driver: Wait's goroutine reaps it when the
			// kernel lets it go.
			stuck = true
		}
	}
	if !stuck {
		// EOF once nothing of the namespace holds the pipes; a process of
		// it stuck in the driver may, so not for ever. Returning closes
		// the read ends, which ends the readers.
		select {
		case <-read:
		case <-grace.C:
		}
	}
	r, step, reported := rep.result()
	r.Duration = time.Since(start)
	switch {
	case reported && killedFor == nil:
		// Its own words. A failure before cuInit is no verdict on the GPU.
		if !gpuStep(r.Step) && !r.OK {
			return r, errors.New(r.String())
		}
		return r, nil
	case errors.Is(killedFor, errTimedOut):
		r = cuda.Result{Step: step, TimedOut: true, Stderr: r.Stderr, Duration: r.Duration,
			Message: fmt.Sprintf("no answer in %v: killed", timeout)}
		if stuck {
			r.Message += fmt.Sprintf("; not reaped %v later (stuck in the driver)", reapGrace)
		}
	case killedFor != nil:
		return cuda.Result{Step: step, Stderr: r.Stderr, Duration: r.Duration, Message: "cancelled"}, killedFor
	default:
		msg := fmt.Sprintf("the probe ended without a report: %v", waitErr)
		if r.Message != "" {
			msg += "; " + r.Message
		}
		r = cuda.Result{Step: step, Stderr: r.Stderr, Duration: r.Duration, Message: msg}
	}
	if !gpuStep(step) {
		return r, errors.New(withStderr(r))
	}
	return r, nil
}

// withStderr is r in one line and, where it ended without a report, the
// end of what it said.
func withStderr(r cuda.Result) string {
	if r.Stderr == "" {
		return r.String()
	}
	return r.String() + ": " + strings.Join(strings.Fields(r.Stderr), " ")
}

var errTimedOut = errors.New("timed out")

// gpuStep says whether a failure in s is a verdict on the GPU: it is once
// CUDA has been called.
func gpuStep(s cuda.Step) bool {
	return s != "" && s != cuda.StepLoad && s != cuda.StepConfine
}

// The lines of the helper's stdout.
const (
	stepPrefix   = "step "   // then the step about to be taken
	resultPrefix = "result " // then the report, as JSON
)

// stderrKeep is how much of the start and of the end of the probe's
// stderr a Result keeps: a crash says what it was first, the driver's last
// words come last.
const stderrKeep = 1024

// report is what the helper said, gathered while it runs.
type report struct {
	mu       sync.Mutex
	step     cuda.Step
	final    *cuda.Result
	badLine  string
	head     []byte // the first stderrKeep bytes of stderr
	tail     []byte // the last bytes after them, up to 4×stderrKeep
	overflow bool   // bytes were dropped between head and tail
}

func newReport() *report { return &report{} }

func (p *report) readStdout(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		p.line(sc.Text())
	}
}

// line takes one line of the helper's stdout.
func (p *report) line(l string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case strings.HasPrefix(l, stepPrefix):
		p.step = cuda.Step(strings.TrimPrefix(l, stepPrefix))
	case strings.HasPrefix(l, resultPrefix):
		var r cuda.Result
		if err := json.Unmarshal([]byte(strings.TrimPrefix(l, resultPrefix)), &r); err != nil {
			p.badLine = fmt.Sprintf("%.200s: %v", l, err)
			return
		}
		p.final = &r
	}
}

func (p *report) readStderr(r io.Reader) {
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		p.mu.Lock()
		b := buf[:n]
		if room := stderrKeep - len(p.head); room > 0 {
			k := min(room, len(b))
			p.head, b = append(p.head, b[:k]...), b[k:]
		}
		p.tail = append(p.tail, b...)
		if len(p.tail) > 4*stderrKeep {
			p.tail, p.overflow = append(p.tail[:0:0], p.tail[len(p.tail)-stderrKeep:]...), true
		}
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// result is the report, if one came, the last step begun, and the end of
// stderr in the Result.
func (p *report) result() (r cuda.Result, step cuda.Step, reported bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.final != nil {
		r, reported = *p.final, true
	} else if p.badLine != "" {
		r.Message = "unreadable report: " + p.badLine
	}
	tail := p.tail
	if len(tail) > stderrKeep {
		tail, p.overflow = tail[len(tail)-stderrKeep:], true
	}
	gap := ""
	if p.overflow {
		gap = "\n…\n"
	}
	r.Stderr = strings.TrimSpace(string(p.head) + gap + string(tail))
	return r, p.step, reported
}
