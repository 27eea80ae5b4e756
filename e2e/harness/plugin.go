package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// stopTimeout is how long Stop waits after SIGTERM before SIGKILL.
const stopTimeout = 10 * time.Second

// PluginOptions says how to run the plugin binary.
type PluginOptions struct {
	Binary  string // from BuildPlugin
	Library string // from BuildMock
	Profile string // path of a machine profile, see ProfilePath
	// PluginDir is the kubelet's device-plugin directory.
	PluginDir string
	// HealthPollInterval is --health-poll-interval; zero keeps the
	// plugin's default.
	HealthPollInterval time.Duration
	// Args are more flags for serve, after the harness's own (a flag
	// given twice takes the later value).
	Args []string
	// Log, when set, also gets the plugin's stderr as it is written.
	Log io.Writer
	// Env is more environment for the plugin on a profile (the mock's
	// MOCK_NVML_DRAIN_STATE, MOCK_NVML_MIG_STATE), after the harness's.
	Env []string
	// Node, when set, is a node whose files already exist: a real GPU
	// node's, or a fixture's (cluster/fixture). The plugin reads them
	// instead of a profile's, so Library and Profile are not used and
	// there is no fault FIFO.
	Node *Node
	// PIDNamespace runs the plugin as the first process of a PID
	// namespace of its own, with its own /proc, as a pod without hostPID
	// runs it (through util-linux's unshare): whatever it starts there
	// ends with it. Its mount namespace keeps the host's propagation, as
	// the chart's Bidirectional MPS volume does.
	PIDNamespace bool
	// Wrapper, when set, is a command that execs the plugin: the plugin
	// binary and its arguments follow it (gpu-check's helper that gives
	// a plugin the kubelet's directory at the fixed path NVIDIA's uses).
	Wrapper []string
	// MountNamespace starts the process (Wrapper's, else the plugin's)
	// in a mount namespace of its own, made private before it runs.
	MountNamespace bool
}

// Node is where a GPU node keeps what the plugin reads. Empty fields keep
// the plugin's defaults (the machine's own /, /sys, /dev, /proc).
type Node struct {
	DriverRoot, SysfsRoot, DevRoot, ProcRoot string
	// Library is --nvml-library; empty lets the plugin find NVML under
	// the driver root.
	Library string
	// Env is more environment for the plugin (a fixture's MOCK_NVML_*).
	Env []string
}

// Args are the plugin's flags for the node.
func (n Node) Args() []string {
	var args []string
	for _, f := range []struct{ flag, v string }{
		{"--driver-root", n.DriverRoot}, {"--sysfs-root", n.SysfsRoot},
		{"--dev-root", n.DevRoot}, {"--proc-root", n.ProcRoot}, {"--nvml-library", n.Library},
	} {
		if f.v != "" {
			args = append(args, f.flag, f.v)
		}
	}
	return args
}

// Plugin is a running gpu-device-plugin process on a mock machine. Its
// sysfs and /dev roots and the mock's control FIFO live in a private
// temporary directory that Stop removes.
type Plugin struct {
	// Profile is the machine the mock NVML library pretends to be; nil
	// on a Node.
	Profile *mocknvml.Profile
	// Started is just before the process was started.
	Started time.Time
	// WorkDir holds SysfsRoot, DevRoot and the control FIFO.
	WorkDir, SysfsRoot, DevRoot string

	cmd *exec.Cmd
	// pidNS: cmd is unshare, and the plugin its only child.
	pidNS bool
	// quiet: the plugin logs above info (logsAboveInfo).
	quiet bool
	ctl   *mocknvml.Control
	log   *syncBuffer
	done  chan struct{} // closed when the process has exited
	err   error         // Wait's error, set before done is closed

	stopOnce sync.Once
	stopErr  error
}

// StartPlugin starts `gpu-device-plugin serve` on the profile: sysfs
// numa_node files and /dev nodes written from it, the mock library loaded
// through --nvml-library, JSON logs on stderr. It returns once the process
// is started, not once it serves; wait on a Kubelet for that.
func StartPlugin(o PluginOptions) (p *Plugin, err error) {
	if o.Node != nil {
		return startOnNode(o)
	}
	for name, v := range map[string]string{"Binary": o.Binary, "Library": o.Library, "Profile": o.Profile, "PluginDir": o.PluginDir} {
		if v == "" {
			return nil, fmt.Errorf("starting plugin: PluginOptions.%s is empty", name)
		}
	}
	prof, err := mocknvml.LoadProfile(o.Profile)
	if err != nil {
		return nil, fmt.Errorf("starting plugin: %w", err)
	}
	work, err := ShortTempDir("gdpp")
	if err != nil {
		return nil, fmt.Errorf("starting plugin: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(work)
		}
	}()
	p = &Plugin{
		Profile:   prof,
		WorkDir:   work,
		SysfsRoot: filepath.Join(work, "sys"),
		DevRoot:   filepath.Join(work, "dev"),
		log:       &syncBuffer{},
		done:      make(chan struct{}),
	}
	if err := prof.WriteSysfs(p.SysfsRoot); err != nil {
		return nil, fmt.Errorf("starting plugin: %w", err)
	}
	if err := prof.WriteDev(p.DevRoot); err != nil {
		return nil, fmt.Errorf("starting plugin: %w", err)
	}
	control := filepath.Join(work, "control")
	if p.ctl, err = mocknvml.OpenControl(control); err != nil {
		return nil, fmt.Errorf("starting plugin: %w", err)
	}
	defer func() {
		if err != nil {
			p.ctl.Close()
		}
	}()

	args := []string{
		"--nvml-library", o.Library,
		"--sysfs-root", p.SysfsRoot,
		"--dev-root", p.DevRoot,
	}
	env := []string{
		"MOCK_NVML_PROFILE=" + o.Profile,
		"MOCK_NVML_CONTROL=" + control,
		"MOCK_NVML_LOG=" + filepath.Join(work, "mock.log"),
	}
	env = append(env, o.Env...)
	if err := p.start(o, args, env); err != nil {
		return nil, err
	}
	return p, nil
}

// startOnNode starts the plugin on o.Node's files.
func startOnNode(o PluginOptions) (*Plugin, error) {
	if o.Binary == "" || o.PluginDir == "" {
		return nil, errors.New("starting plugin: PluginOptions.Binary and PluginDir are needed")
	}
	work, err := ShortTempDir("gdpp")
	if err != nil {
		return nil, fmt.Errorf("starting plugin: %w", err)
	}
	p := &Plugin{WorkDir: work, SysfsRoot: o.Node.SysfsRoot, DevRoot: o.Node.DevRoot, log: &syncBuffer{}, done: make(chan struct{})}
	if err := p.start(o, o.Node.Args(), o.Node.Env); err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	return p, nil
}

// start runs `serve` with the harness's flags, then args, then o.Args.
func (p *Plugin) start(o PluginOptions, args, env []string) error {
	args = append([]string{"serve",
		"--device-plugin-dir", o.PluginDir,
		"--log-format", "json",
		// Never the machine's own; a test may pass another after these.
		"--state-dir", filepath.Join(p.WorkDir, "state"),
		"--device-info-dir", filepath.Join(p.WorkDir, "devinfo"),
	}, args...)
	if o.HealthPollInterval > 0 {
		args = append(args, "--health-poll-interval", o.HealthPollInterval.String())
	}
	args = append(args, o.Args...)
	p.quiet = logsAboveInfo(args)
	name := o.Binary
	if len(o.Wrapper) > 0 {
		if o.PIDNamespace {
			return errors.New("starting plugin: PluginOptions.Wrapper and PIDNamespace do not go together")
		}
		name, args = o.Wrapper[0], append(append(slices.Clone(o.Wrapper[1:]), o.Binary), args...)
	}
	if o.PIDNamespace {
		unshare, err := exec.LookPath("unshare")
		if err != nil {
			return fmt.Errorf("starting plugin in a PID namespace of its own: %w (unshare is part of util-linux)", err)
		}
		// --kill-child: the plugin dies with unshare, which the
		// harness's Pdeathsig kills with the test.
		args = append([]string{"--pid", "--fork", "--mount-proc", "--propagation", "unchanged", "--kill-child", "--", o.Binary}, args...)
		name, p.pidNS = unshare, true
	}
	return p.run(command(name, args, o.MountNamespace), env, o.Log)
}

// command is name with args, in a mount namespace of its own when
// mountNS: Go unshares it between fork and exec and makes / private.
func command(name string, args []string, mountNS bool) *exec.Cmd {
	cmd := exec.Command(name, args...)
	if mountNS {
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	}
	return cmd
}

// Command is another program to run as a Plugin is run (its log, Stop,
// Usage): NVIDIA's device plugin beside ours.
type Command struct {
	Binary string
	Args   []string
	// Env is more environment, after the parent's without the plugin's
	// and the mock's settings.
	Env []string
	// Wrapper and MountNamespace are as in PluginOptions.
	Wrapper        []string
	MountNamespace bool
}

// StartCommand starts c and returns once it is started. Its Started is
// taken as a plugin's is, so the two compare.
func StartCommand(c Command) (*Plugin, error) {
	if c.Binary == "" {
		return nil, errors.New("starting command: Command.Binary is empty")
	}
	name, args := c.Binary, c.Args
	if len(c.Wrapper) > 0 {
		name, args = c.Wrapper[0], append(append(slices.Clone(c.Wrapper[1:]), c.Binary), c.Args...)
	}
	p := &Plugin{log: &syncBuffer{}, done: make(chan struct{})}
	if err := p.run(command(name, args, c.MountNamespace), c.Env, nil); err != nil {
		return nil, err
	}
	return p, nil
}

// run starts cmd with the parent's environment (pluginEnv) and env, its
// output in the log (and in also, when set).
func (p *Plugin) run(cmd *exec.Cmd, env []string, also io.Writer) error {
	cmd.Env = append(pluginEnv(os.Environ()), env...)
	var out io.Writer = p.log
	if also != nil {
		out = io.MultiWriter(p.log, also)
	}
	cmd.Stdout, cmd.Stderr = out, out
	// The plugin dies with the test, even one that panics or is killed.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	p.cmd = cmd
	p.Started = time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", filepath.Base(cmd.Path), err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return nil
}

// StartLauncher starts `mps-launcher` of the plugin binary on node's
// driver and /dev roots, with args (its --mps-launcher-socket and
// --mps-root) and JSON logs, in this process's PID namespace, as the
// chart's DaemonSet runs it with hostPID. It returns once the process is
// started; Stop, Log and WaitLog work as for a plugin.
func StartLauncher(binary string, node *Node, args ...string) (*Plugin, error) {
	p := &Plugin{log: &syncBuffer{}, done: make(chan struct{})}
	full := []string{"mps-launcher", "--log-format", "json"}
	for _, f := range []struct{ flag, v string }{{"--driver-root", node.DriverRoot}, {"--dev-root", node.DevRoot}} {
		if f.v != "" {
			full = append(full, f.flag, f.v)
		}
	}
	if err := p.run(exec.Command(binary, append(full, args...)...), node.Env, nil); err != nil {
		return nil, err
	}
	return p, nil
}

// pluginEnv is the parent's environment without settings that would
// change the plugin or the mock behind the harness's back.
func pluginEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		if strings.HasPrefix(kv, "GPU_DEVICE_PLUGIN_") || strings.HasPrefix(kv, "MOCK_NVML_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// Pid is the plugin's process id, in this process's PID namespace.
func (p *Plugin) Pid() int {
	if p.pidNS {
		if pid, err := childOf(p.cmd.Process.Pid); err == nil {
			return pid
		}
	}
	return p.cmd.Process.Pid
}

// terminate sends SIGTERM to the plugin: with PIDNamespace, to unshare's
// child, for unshare ignores SIGTERM and forwards nothing.
func (p *Plugin) terminate() error {
	if !p.pidNS {
		return p.cmd.Process.Signal(syscall.SIGTERM)
	}
	pid, err := childOf(p.cmd.Process.Pid)
	if err != nil {
		return err
	}
	return syscall.Kill(pid, syscall.SIGTERM)
}

// childOf is the process id of parent's child, from /proc/<pid>/stat.
func childOf(parent int) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Field 4, the parent's pid, after the command name's ')'.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
			if f := strings.Fields(string(stat[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(parent) {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no child of process %d in /proc", parent)
}

// Exited is closed when the process has exited.
func (p *Plugin) Exited() <-chan struct{} { return p.done }

// Inject sends a fault to the mock library ("xid 3 79", "temp 2 95"; see
// mocknvml.Control) and returns once the library has applied it. An XID
// waits (up to 10 s) for the plugin to say it watches NVML events: NVML,
// and the mock, deliver an event only to the sets registered when it
// happens, and the plugin may serve its devices before its set is. A
// plugin that logs above info (a fleet's) does not say it: its XID is
// sent at once.
func (p *Plugin) Inject(command string) error {
	if p.ctl == nil {
		return errors.New("inject: the plugin runs on a node's own files, without a fault FIFO")
	}
	if strings.HasPrefix(command, "xid ") && !p.quiet {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		// Not found: a node whose GPUs have no events; the XID is then
		// sent anyway, for the test to see what the plugin does.
		_, _ = p.WaitLog(ctx, "NVML events watched", func(e LogEntry) bool { return e.String("msg") == eventsWatched })
		cancel()
	}
	return p.ctl.Inject(command)
}

// Control is the mock library's control FIFO, for the calls Inject does
// not wrap (mocknvml.Control.WaitResetPaused); nil on a node's own files.
func (p *Plugin) Control() *mocknvml.Control { return p.ctl }

// logsAboveInfo says whether serve's flags set a log level above info,
// where the plugin's info lines are not written.
func logsAboveInfo(args []string) bool {
	level := ""
	for i, a := range args {
		switch {
		case a == "--log-level" && i+1 < len(args):
			level = args[i+1]
		case strings.HasPrefix(a, "--log-level="):
			level = strings.TrimPrefix(a, "--log-level=")
		}
	}
	return level == "warn" || level == "error"
}

// eventsWatched is the plugin's log message once its NVML event set is
// registered (package nvml, Monitor.WatchEvents).
const eventsWatched = "watching NVML events (XIDs, double-bit ECC, recovery actions)"

// Log returns what the plugin wrote to stderr and stdout so far.
func (p *Plugin) Log() string { return p.log.String() }

// Stop sends SIGTERM, waits for the process to exit (SIGKILL after
// stopTimeout), and removes the work directory. It returns an error if the
// plugin had to be killed or exited non-zero. Calling it again returns the
// first answer.
func (p *Plugin) Stop() error {
	p.stopOnce.Do(func() {
		var errs []error
		select {
		case <-p.done:
			errs = append(errs, fmt.Errorf("plugin exited before Stop: %v", p.err))
		default:
			if err := p.terminate(); err != nil {
				errs = append(errs, fmt.Errorf("stopping plugin: %w", err))
			}
			select {
			case <-p.done:
				if p.err != nil {
					errs = append(errs, fmt.Errorf("plugin exited after SIGTERM: %w", p.err))
				}
			case <-time.After(stopTimeout):
				p.cmd.Process.Kill()
				<-p.done
				errs = append(errs, fmt.Errorf("plugin still running %v after SIGTERM; killed", stopTimeout))
			}
		}
		errs = append(errs, p.closeControl(), os.RemoveAll(p.WorkDir))
		p.stopErr = errors.Join(errs...)
	})
	return p.stopErr
}

// Kill sends SIGKILL, as the OOM killer or a node crash would: the plugin
// gets no chance to remove its socket. It waits for the process to exit
// and removes the work directory; Stop afterwards returns Kill's answer.
func (p *Plugin) Kill() error {
	killed := false
	p.stopOnce.Do(func() {
		killed = true
		var errs []error
		select {
		case <-p.done:
			errs = append(errs, fmt.Errorf("plugin exited before Kill: %v", p.err))
		default:
			if err := p.cmd.Process.Kill(); err != nil {
				errs = append(errs, fmt.Errorf("killing plugin: %w", err))
			}
			<-p.done
		}
		errs = append(errs, p.closeControl(), os.RemoveAll(p.WorkDir))
		p.stopErr = errors.Join(errs...)
	})
	if !killed {
		return errors.New("killing plugin: already stopped")
	}
	return p.stopErr
}

func (p *Plugin) closeControl() error {
	if p.ctl == nil {
		return nil
	}
	return p.ctl.Close()
}

// Usage is what a process cost.
type Usage struct {
	// PeakRSS is the high-water mark of resident memory (VmHWM), in bytes.
	PeakRSS int64
	// RSS is resident memory now (VmRSS), in bytes: RSSAnon (heap, stacks,
	// the runtime's own) plus RSSFile (the mapped executable and libraries)
	// plus shared memory. Zero once the process has exited.
	RSS, RSSAnon, RSSFile int64
	// User and System are the CPU time spent in user and kernel mode.
	User, System time.Duration
}

// CPU is the total CPU time.
func (u Usage) CPU() time.Duration { return u.User + u.System }

// Usage reads the running plugin's peak RSS and CPU time from
// /proc/<pid>/status and /proc/<pid>/stat; after it has exited, from the
// kernel's rusage of the reaped process.
func (p *Plugin) Usage() (Usage, error) {
	select {
	case <-p.done:
		st := p.cmd.ProcessState
		ru, ok := st.SysUsage().(*syscall.Rusage)
		if !ok {
			return Usage{}, errors.New("plugin usage: no rusage")
		}
		return Usage{PeakRSS: ru.Maxrss << 10, User: st.UserTime(), System: st.SystemTime()}, nil
	default:
	}
	u, err := ProcUsage(p.Pid())
	if err != nil {
		return Usage{}, fmt.Errorf("plugin usage: %w", err)
	}
	return u, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times; 100 on every
// Linux architecture Go supports (sysconf would need cgo).
const clockTicks = 100

// ProcUsage reads a live process's VmHWM, VmRSS, RssAnon, RssFile and
// utime+stime from /proc.
func ProcUsage(pid int) (Usage, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return Usage{}, err
	}
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	for _, f := range []struct {
		key string
		to  *int64
	}{{"VmHWM", &u.PeakRSS}, {"VmRSS", &u.RSS}, {"RssAnon", &u.RSSAnon}, {"RssFile", &u.RSSFile}} {
		if *f.to, err = parseStatusKB(status, f.key); err != nil {
			return Usage{}, err
		}
	}
	if u.User, u.System, err = parseStatTimes(stat); err != nil {
		return Usage{}, err
	}
	return u, nil
}

// parseStatusKB finds "<key>:   1234 kB" in /proc/<pid>/status and
// returns it in bytes.
func parseStatusKB(status []byte, key string) (int64, error) {
	for line := range strings.SplitSeq(string(status), "\n") {
		v, ok := strings.CutPrefix(line, key+":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("status: %s line %q is not <n> kB", key, line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("status: %s line %q: %w", key, line, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("status: no %s line", key)
}

// parseStatTimes reads utime and stime, fields 14 and 15 of
// /proc/<pid>/stat. The command name, field 2, is in parentheses and may
// hold blanks and parentheses itself, so fields are counted after the last ')'.
func parseStatTimes(stat []byte) (user, system time.Duration, err error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, errors.New("stat: no command name")
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state), so field n is f[n-3].
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("stat: %d fields after the command name, want at least 13", len(f))
	}
	ticks := make([]int64, 2)
	for k, field := range f[11:13] {
		if ticks[k], err = strconv.ParseInt(field, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("stat: utime/stime %q: %w", field, err)
		}
	}
	tick := time.Second / clockTicks
	return time.Duration(ticks[0]) * tick, time.Duration(ticks[1]) * tick, nil
}

// LogEntry is one JSON line of the plugin's log: "msg", "level" and the
// structured keys ("device", "reason", ...).
type LogEntry map[string]any

// String returns the entry's value for key as text, "" when absent.
func (e LogEntry) String(key string) string {
	v, ok := e[key]
	if !ok {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// LogEntries parses the plugin's JSON log so far; lines that are not JSON
// (a panic, the CLI's own error line) are skipped.
func (p *Plugin) LogEntries() []LogEntry {
	entries, _ := p.log.entries()
	return entries
}

// WaitLog waits until the log has an entry that satisfies match and
// returns the first such entry.
func (p *Plugin) WaitLog(ctx context.Context, what string, match func(LogEntry) bool) (LogEntry, error) {
	for {
		entries, changed := p.log.entries()
		for _, e := range entries {
			if match(e) {
				return e, nil
			}
		}
		select {
		case <-changed:
		case <-p.done:
			// The last write happened before Wait returned; look once more.
			for _, e := range p.LogEntries() {
				if match(e) {
					return e, nil
				}
			}
			return nil, fmt.Errorf("plugin log: no %s; the plugin exited: %v", what, p.err)
		case <-ctx.Done():
			return nil, fmt.Errorf("plugin log: no %s: %w", what, context.Cause(ctx))
		}
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and many readers, that
// tells readers when it grows.
type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on every write
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// entries parses the complete JSON lines so far, and returns a channel
// closed at the next write.
func (b *syncBuffer) entries() ([]LogEntry, <-chan struct{}) {
	b.mu.Lock()
	text := b.buf.String()
	if b.changed == nil {
		b.changed = make(chan struct{})
	}
	changed := b.changed
	b.mu.Unlock()
	var out []LogEntry
	for line := range strings.Lines(text) {
		if !strings.HasSuffix(line, "\n") {
			break // a partial line; the rest comes with the next write
		}
		var e LogEntry
		if json.Unmarshal([]byte(line), &e) == nil {
			out = append(out, e)
		}
	}
	return out, changed
}
