// Package imexd runs one nvidia-imex per ComputeDomain a node takes part
// in: its config.cfg and nodes_config.cfg written under the domain's own
// directory, the daemon started from the driver root, confined as the MPS
// control daemons are (package mpsexec: a mount namespace of its own,
// chrooted into the driver root with the domain's directory bound at
// RootDir/<UID>, an environment of ours), restarted when it dies,
// restarted when its peers change, asked whether it is ready through
// nvidia-imex-ctl -q (run the same way), and stopped with its directory
// removed when the domain is done on the node.
package imexd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/atomicfile"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpsexec"
)

// RootDir is where a domain's directory is shown inside the driver root
// (RootDir/<UID>) to a chrooted nvidia-imex and nvidia-imex-ctl: the
// config files name their paths there.
const RootDir = "/tmp/gpu-device-plugin-imex"

// Options configure Daemons.
type Options struct {
	// Dir holds one directory per domain (its UID): config.cfg,
	// nodes_config.cfg, the log and PID file.
	Dir string
	// BindIP is this node's address, the one its status entry gives.
	BindIP string
	// ServerPort and CmdPort are nvidia-imex's ports; zero is NVIDIA's
	// default.
	ServerPort, CmdPort int
	// DriverRoot has the driver's programs, found and run as
	// mpsexec.LocateProgram says: a whole root is chrooted into with the
	// domain's directory bound at RootDir/<UID>. DevRoot is bound on its
	// /dev (the IMEX channels); "": /dev.
	DriverRoot, DevRoot string
	// Self is this executable, the mps-exec helper.
	Self string
	// Command makes the run of s; nil: mpsexec.Command(ctx, Self, s),
	// the program confined. Tests may run it otherwise.
	Command func(ctx context.Context, s mpsexec.Spec) (*exec.Cmd, error)
	// RestartDelay is the wait before a dead daemon is started again,
	// doubled up to a minute while it keeps dying; zero is one second.
	RestartDelay time.Duration
	Log          *slog.Logger
	// Started, when set, is told each start of a daemon (its PID).
	Started func(domain string, pid int)
}

// Daemons are the node's IMEX daemons, by domain UID.
type Daemons struct {
	o  Options
	mu sync.Mutex
	d  map[string]*daemon
}

type daemon struct {
	dir string
	// spec runs nvidia-imex (its Args unset), and seen is where it sees
	// dir.
	spec   mpsexec.Spec
	seen   string
	peers  []string
	cancel context.CancelFunc
	done   chan struct{}
	// starts counts the daemon's starts, for status and tests.
	starts int
}

// New makes Daemons; none run until Ensure.
func New(o Options) *Daemons {
	if o.ServerPort == 0 {
		o.ServerPort = computedomain.DefaultServerPort
	}
	if o.CmdPort == 0 {
		o.CmdPort = computedomain.DefaultCmdPort
	}
	if o.RestartDelay <= 0 {
		o.RestartDelay = time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Command == nil {
		self := o.Self
		o.Command = func(ctx context.Context, s mpsexec.Spec) (*exec.Cmd, error) { return mpsexec.Command(ctx, self, s) }
	}
	return &Daemons{o: o, d: map[string]*daemon{}}
}

// config is the daemon's configuration, its files under seen.
func (ds *Daemons) config(seen string) computedomain.IMEX {
	return computedomain.IMEX{BindIP: ds.o.BindIP, ServerPort: ds.o.ServerPort, CmdPort: ds.o.CmdPort,
		NodesFile: path.Join(seen, "nodes_config.cfg"), LogFile: path.Join(seen, "nvidia-imex.log"),
		PIDFile: path.Join(seen, "nvidia-imex.pid")}
}

// spec is how the driver root's program name runs for the domain whose
// directory is dir, and where it sees dir: chrooted, at RootDir/<UID>,
// bound there; otherwise (the host's root, or a root of programs and
// libraries only) at dir itself. Its environment is ours alone (mpsexec).
func (ds *Daemons) spec(name, dir string) (mpsexec.Spec, string, error) {
	s, err := mpsexec.LocateProgram(ds.o.DriverRoot, name)
	if err != nil {
		return s, "", fmt.Errorf("imexd: %w", err)
	}
	s.DevRoot = ds.o.DevRoot
	seen := dir
	if s.DriverRoot != "" {
		seen = path.Join(RootDir, filepath.Base(dir))
		s.Binds = []mpsexec.Bind{{Source: dir, Target: seen}}
	}
	return s, seen, nil
}

// Ensure runs domain's daemon with peers (every address of the clique,
// this node's included): started when it is not running, restarted when
// the peers differ from those it runs with, left alone otherwise. ctx
// bounds the daemon's life: its end stops the daemon as Stop does, but
// leaves the directory.
func (ds *Daemons) Ensure(ctx context.Context, domain string, peers []string) error {
	if !validName(domain) {
		return fmt.Errorf("imexd: domain %q is not a UID", domain)
	}
	peers = slices.Sorted(slices.Values(peers))
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if d := ds.d[domain]; d != nil {
		if slices.Equal(d.peers, peers) {
			return nil
		}
		ds.o.Log.Info("IMEX peers changed; restarting the daemon", "domain", domain, "peers", strings.Join(peers, ","))
		d.cancel()
		<-d.done
		delete(ds.d, domain)
	}
	dir := filepath.Join(ds.o.Dir, domain)
	spec, seen, err := ds.spec("nvidia-imex", dir)
	if err != nil {
		return err
	}
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("imexd: domain %s: %w", domain, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("imexd: %w", err)
	}
	if _, err := atomicfile.Write(filepath.Join(dir, "nodes_config.cfg"), []byte(computedomain.NodesConfigFile(peers)), atomicfile.Options{}); err != nil {
		return fmt.Errorf("imexd: domain %s: %w", domain, err)
	}
	if _, err := atomicfile.Write(filepath.Join(dir, "config.cfg"), []byte(ds.config(seen).ConfigFile()), atomicfile.Options{}); err != nil {
		return fmt.Errorf("imexd: domain %s: %w", domain, err)
	}
	dctx, cancel := context.WithCancel(ctx)
	d := &daemon{dir: dir, spec: spec, seen: seen, peers: peers, cancel: cancel, done: make(chan struct{})}
	ds.d[domain] = d
	go ds.supervise(dctx, domain, d)
	return nil
}

// supervise starts the daemon and starts it again when it dies, until ctx
// ends; then it stops it (SIGTERM through CommandContext's Cancel).
func (ds *Daemons) supervise(ctx context.Context, domain string, d *daemon) {
	defer close(d.done)
	delay := ds.o.RestartDelay
	for ctx.Err() == nil {
		s := d.spec
		s.Args = []string{"-c", path.Join(d.seen, "config.cfg")}
		began := time.Now()
		var stderr bytes.Buffer
		// The helper execs the program: the PID is the daemon's, which the
		// signals below reach.
		cmd, err := ds.o.Command(ctx, s)
		if err == nil {
			cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
			cmd.WaitDelay = 10 * time.Second
			cmd.Stderr = &stderr
			err = cmd.Start()
		}
		if err == nil {
			ds.mu.Lock()
			d.starts++
			ds.mu.Unlock()
			ds.o.Log.Info("IMEX daemon started", "domain", domain, "pid", cmd.Process.Pid)
			if ds.o.Started != nil {
				ds.o.Started(domain, cmd.Process.Pid)
			}
			err = cmd.Wait()
		}
		if ctx.Err() != nil {
			break
		}
		if time.Since(began) > time.Minute {
			delay = ds.o.RestartDelay
		}
		ds.o.Log.Warn("IMEX daemon ended; starting it again", "domain", domain, "err", err,
			"stderr", strings.TrimSpace(stderr.String()), "after", delay)
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Minute)
	}
	ds.o.Log.Info("IMEX daemon stopped", "domain", domain)
}

// Ready asks domain's daemon through nvidia-imex-ctl -q: nil when it says
// READY, else why not.
func (ds *Daemons) Ready(ctx context.Context, domain string) error {
	ds.mu.Lock()
	d := ds.d[domain]
	ds.mu.Unlock()
	if d == nil {
		return fmt.Errorf("no IMEX daemon runs for domain %s", domain)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, seen, err := ds.spec("nvidia-imex-ctl", d.dir)
	if err != nil {
		return err
	}
	s.Args = []string{"-q", "-c", path.Join(seen, "config.cfg")}
	cmd, err := ds.o.Command(ctx, s)
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("nvidia-imex-ctl -q: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	if got := strings.TrimSpace(string(out)); got != "READY" {
		return fmt.Errorf("IMEX daemon not ready: nvidia-imex-ctl -q says %q", got)
	}
	return nil
}

// Starts is how many times domain's daemon was started (0: none runs).
func (ds *Daemons) Starts(domain string) int {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if d := ds.d[domain]; d != nil {
		return d.starts
	}
	return 0
}

// Stop stops domain's daemon, waits for it to end and removes its
// directory. Stopping a domain that runs none only removes the directory.
func (ds *Daemons) Stop(domain string) error {
	if !validName(domain) {
		return fmt.Errorf("imexd: domain %q is not a UID", domain)
	}
	ds.mu.Lock()
	d := ds.d[domain]
	delete(ds.d, domain)
	ds.mu.Unlock()
	if d != nil {
		d.cancel()
		<-d.done
	} else if err := ds.killOrphan(domain); err != nil {
		ds.o.Log.Warn("an IMEX daemon an earlier run left may still run", "domain", domain, "err", err)
	}
	if err := os.RemoveAll(filepath.Join(ds.o.Dir, domain)); err != nil {
		return fmt.Errorf("imexd: %w", err)
	}
	return nil
}

// killOrphan kills the daemon an earlier run of the plugin left for domain
// (a SIGKILLed plugin run as a host process: in a pod the container's end
// takes it along), named by its PID file, so it frees its ports. The PID
// is opened as a pidfd first and the process's command line must name the
// domain's directory, so a PID reused since is never signalled.
func (ds *Daemons) killOrphan(domain string) error {
	b, err := os.ReadFile(filepath.Join(ds.o.Dir, domain, "nvidia-imex.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("imexd: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return fmt.Errorf("imexd: PID file of %s: %q is not a PID", domain, b)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("imexd: opening process %d: %w", pid, err)
	}
	defer unix.Close(fd)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte("nvidia-imex")) || !bytes.Contains(cmdline, []byte(domain)) {
		return nil // gone, or another process has the PID now
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("imexd: killing the IMEX daemon %d an earlier run left: %w", pid, err)
	}
	ds.o.Log.Info("killed the IMEX daemon an earlier run left", "domain", domain, "pid", pid)
	return nil
}

// Running are the domains whose daemons run, sorted.
func (ds *Daemons) Running() []string {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return slices.Sorted(func(yield func(string) bool) {
		for k := range ds.d {
			if !yield(k) {
				return
			}
		}
	})
}

// Sweep stops the daemons and removes the directories of domains not in
// keep: what an earlier run left, or domains deleted while this one was
// down. Nothing half-started stays on the node.
func (ds *Daemons) Sweep(keep []string) error {
	var errs []error
	for _, dom := range ds.Running() {
		if !slices.Contains(keep, dom) {
			errs = append(errs, ds.Stop(dom))
		}
	}
	ents, err := os.ReadDir(ds.o.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("imexd: %w", err)
	}
	running := ds.Running()
	for _, e := range ents {
		switch {
		case !e.IsDir() || !validName(e.Name()):
		case !slices.Contains(keep, e.Name()):
			errs = append(errs, ds.Stop(e.Name()))
		case !slices.Contains(running, e.Name()):
			// Kept, and the daemon an earlier run left would hold the
			// ports of the one Ensure starts next.
			errs = append(errs, ds.killOrphan(e.Name()))
		}
	}
	return errors.Join(errs...)
}

// validName: a UID is letters, digits and dashes; nothing that walks out
// of Dir.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}
