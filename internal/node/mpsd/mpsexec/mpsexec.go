// Package mpsexec runs the driver's nvidia-cuda-mps-control confined the
// way it must run from the plugin's DaemonSet: the daemon start (-d) and
// each control-client call alike.
//
// Chroot: the plugin's container has no glibc of its own, so it cannot run
// the driver's binary where it stands; the driver root (the host's driver
// install, mounted into the container) has the binary and the libraries it
// links, so the binary runs chrooted there.
//
// A private mount namespace: inside the root, the binary needs the devices,
// /proc and /sys, the GPU's own shared-memory directory on /dev/shm (MPS
// clients of that GPU get the same directory on theirs) and the GPU's pipe
// and log directories. Those mounts are made in a mount namespace of the
// helper's own, with / recursively private, so none reaches the host or the
// plugin's container. The daemon that -d forks stays in that namespace,
// which keeps its mounts alive for as long as it runs; each later
// control-client call sets a namespace up afresh, binding the same pipe
// directory, so it reaches the daemon's socket.
//
// What the daemon sees, chrooted: the driver root as /, the plugin's
// /dev (Spec.DevRoot), /proc and /sys on theirs, Spec.Shm on /dev/shm, a
// small tmpfs on /tmp (the host's /tmp stays out of reach), and Spec.Pipe
// and Spec.Log at RootPipe and RootLog, named by CUDA_MPS_PIPE_DIRECTORY
// and CUDA_MPS_LOG_DIRECTORY.
//
// Other driver programs run the same way: nvidia-smi (SetTimeSlice) and
// nvidia-imex with nvidia-imex-ctl (internal/node/imexd), which get their
// own directories through Spec.Binds, under the same /tmp.
//
// The namespace must exist before the first mount, and Go cannot unshare
// a mount namespace for a whole running process; so Command starts this
// executable again (HelperCommand) in a fresh namespace, and Main, the
// helper, mounts, chroots and execs the binary.
package mpsexec

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

const (
	// HelperCommand is the subcommand of our own executable that runs Main
	// with the spec, as JSON, as its one argument.
	HelperCommand = "mps-exec"
	// DefaultBinary is nvidia-cuda-mps-control's path in the driver root.
	DefaultBinary = "/usr/bin/nvidia-cuda-mps-control"
	// RootPipe and RootLog are where Spec.Pipe and Spec.Log are bound
	// inside the driver root.
	RootPipe = "/tmp/gpu-device-plugin-mps/pipe"
	RootLog  = "/tmp/gpu-device-plugin-mps/log"
)

// Spec is one run of the binary. Paths other than Binary are as the
// calling process sees them.
type Spec struct {
	// DriverRoot is chrooted into; "" or "/": no chroot.
	DriverRoot string `json:"driverRoot,omitempty"`
	// DevRoot is bound on the root's /dev; "": /dev. Unused without chroot.
	DevRoot string `json:"devRoot,omitempty"`
	// Shm is bound on /dev/shm; "": the /dev/shm of DevRoot (chroot) or
	// the caller's (no chroot) stays.
	Shm string `json:"shm,omitempty"`
	// Pipe and Log are the MPS pipe and log directories, which the control
	// program requires; other programs (nvidia-smi) may go without.
	Pipe string `json:"pipe,omitempty"`
	Log  string `json:"log,omitempty"`
	// Binary is the path inside the driver root; "": DefaultBinary.
	Binary string `json:"binary,omitempty"`
	// Args are the binary's arguments: ["-d"] starts the daemon, none makes
	// it the control client, reading commands on stdin.
	Args []string `json:"args,omitempty"`
	// Env are variables added to the environment, KEY=VALUE, such as
	// CUDA_VISIBLE_DEVICES=<uuid>.
	Env []string `json:"env,omitempty"`
	// Binds are further directories shown inside the driver root, such as
	// an IMEX domain's config directory. Only with a chroot.
	Binds []Bind `json:"binds,omitempty"`
}

// Bind shows the directory Source (as the calling process sees it) at
// Target inside the driver root. Target is under /tmp, the helper's
// tmpfs, where its mount point is made: nothing is made in the driver
// install.
type Bind struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

// bindTop is where Targets go, and rootTop the helper's own directory
// there (RootPipe, RootLog), which no Target may reach.
const (
	bindTop = "/tmp"
	rootTop = "/tmp/gpu-device-plugin-mps"
)

// Command returns the command that runs s through the helper: self (our
// own executable, os.Executable()) with HelperCommand and s, in a mount
// namespace of its own. The caller sets Stdin, Stdout and Stderr.
func Command(ctx context.Context, self string, s Spec) (*exec.Cmd, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("mps-exec spec: %w", err)
	}
	cmd := exec.CommandContext(ctx, self, HelperCommand, string(b))
	// With CLONE_NEWNS in Unshareflags, Go also makes / recursively
	// private in the child before it execs, so no mount propagates out.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	return cmd, nil
}

// decode reads the helper's argument.
func decode(arg string) (Spec, error) {
	var s Spec
	if strings.TrimSpace(arg) == "" {
		return s, fmt.Errorf("mps-exec: no spec given; %s is run by the plugin with its spec as JSON", HelperCommand)
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(arg)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("mps-exec spec: not a valid spec: %w", err)
	}
	if dec.More() {
		return s, fmt.Errorf("mps-exec spec: unexpected data after the spec")
	}
	return s, s.Validate()
}

// The variables Main sets itself from Pipe and Log.
const (
	pipeEnv = "CUDA_MPS_PIPE_DIRECTORY"
	logEnv  = "CUDA_MPS_LOG_DIRECTORY"
)

// Validate says what is wrong with s, as Command and the helper would, in
// one line naming the key.
func (s Spec) Validate() error {
	control := path.Base(s.binary()) == controlName
	for _, p := range []struct {
		key, path string
		required  bool
	}{
		{"pipe", s.Pipe, control}, {"log", s.Log, control}, {"driverRoot", s.DriverRoot, false},
		{"devRoot", s.DevRoot, false}, {"shm", s.Shm, false}, {"binary", s.Binary, false},
	} {
		switch {
		case p.path == "" && p.required:
			return fmt.Errorf("mps-exec spec: %s is empty; set it to an absolute path", p.key)
		case p.path != "" && !filepath.IsAbs(p.path):
			return fmt.Errorf("mps-exec spec: %s %q is not an absolute path", p.key, p.path)
		}
	}
	if err := s.validateBinds(); err != nil {
		return err
	}
	for _, kv := range s.Env {
		k, _, ok := strings.Cut(kv, "=")
		switch {
		case !ok || k == "":
			return fmt.Errorf("mps-exec spec: env %q is not KEY=VALUE", kv)
		case k == pipeEnv || k == logEnv:
			return fmt.Errorf("mps-exec spec: env sets %s, which mps-exec sets from pipe and log; remove it", k)
		}
	}
	return nil
}

// validateBinds refuses a bind whose target is not a plain path under
// /tmp, reaches the helper's own directory or another bind's, or is
// given without a chroot.
func (s Spec) validateBinds() error {
	if len(s.Binds) > 0 && !s.chroot() {
		return fmt.Errorf("mps-exec spec: binds are given without a driverRoot to chroot into; set driverRoot, or pass the sources' own paths")
	}
	for i, b := range s.Binds {
		key := fmt.Sprintf("binds[%d]", i)
		switch {
		case !filepath.IsAbs(b.Source):
			return fmt.Errorf("mps-exec spec: %s.source %q is not an absolute path", key, b.Source)
		case !path.IsAbs(b.Target) || path.Clean(b.Target) != b.Target || slices.Contains(strings.Split(b.Target, "/"), ".."):
			return fmt.Errorf("mps-exec spec: %s.target %q is not a clean absolute path; give one under %s, such as %s/<name>", key, b.Target, bindTop, bindTop)
		case !within(b.Target, bindTop) || b.Target == bindTop:
			return fmt.Errorf("mps-exec spec: %s.target %q is not under %s, the only place its mount point is made; give one under %s", key, b.Target, bindTop, bindTop)
		case within(b.Target, rootTop) || within(rootTop, b.Target):
			return fmt.Errorf("mps-exec spec: %s.target %q reaches %s, the MPS pipe and log directories'; give another", key, b.Target, rootTop)
		}
		for j, o := range s.Binds[:i] {
			if within(b.Target, o.Target) || within(o.Target, b.Target) {
				return fmt.Errorf("mps-exec spec: %s.target %q and binds[%d].target %q overlap; give each its own directory", key, b.Target, j, o.Target)
			}
		}
	}
	return nil
}

// within says whether p is dir or below it (both clean).
func within(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// chroot tells whether s runs in a driver root other than /.
func (s Spec) chroot() bool { return s.DriverRoot != "" && filepath.Clean(s.DriverRoot) != "/" }

func (s Spec) binary() string {
	if s.Binary == "" {
		return DefaultBinary
	}
	return s.Binary
}

// basePath is the binary's PATH: where the control daemon finds
// nvidia-cuda-mps-server, in the driver root.
const basePath = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"

// environ is the binary's environment, of our own making: nothing of the
// plugin's (its tokens, proxies, CUDA or loader variables) reaches the
// daemon or the servers it starts. It is PATH, then extra (the spec's),
// then the pipe and log directories.
func environ(extra []string, pipe, log string) []string {
	env := append([]string{basePath}, slices.DeleteFunc(slices.Clone(extra), func(kv string) bool {
		return strings.HasPrefix(kv, "PATH=")
	})...)
	if pipe != "" {
		env = append(env, pipeEnv+"="+pipe)
	}
	if log != "" {
		env = append(env, logEnv+"="+log)
	}
	return env
}
