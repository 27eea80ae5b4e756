package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/sharing"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpsexec"
)

// Options configure a Server. Every path is as the launcher sees it.
type Options struct {
	// Socket is where the launcher listens (mode 0600).
	Socket string
	// Root is the mpsRoot: a GPU's directories are sharing.MPSDir(Root, ...),
	// which the plugin makes before it asks.
	Root string
	// DriverRoot and DevRoot are where the control program is found and
	// what it sees as /dev (package mpsexec).
	DriverRoot, DevRoot string
	// Self is this executable, the mps-exec helper.
	Self string
	// Timeout bounds each start; 0: 20s, so that the answer reaches the
	// plugin before its own 30s bound on the start ends.
	Timeout time.Duration
	// Command builds the run of s; nil: mpsexec.Command(ctx, Self, s), the
	// control program confined. Tests run it unconfined.
	Command func(ctx context.Context, s mpsexec.Spec) (*exec.Cmd, error)
	// ProcRoot is the process table MPS servers are looked for in; "":
	// /proc (the host's: the launcher runs in the host PID namespace).
	ProcRoot string
	Log      *slog.Logger
}

// Server starts the control daemons it is asked for.
type Server struct {
	o Options

	mu sync.Mutex
	// starting are the GPUs whose start is under way: a second request
	// for one is refused rather than racing it.
	starting map[string]bool
}

// New returns a Server; Serve listens.
func New(o Options) *Server {
	if o.Timeout <= 0 {
		o.Timeout = 20 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.Command == nil {
		o.Command = func(ctx context.Context, s mpsexec.Spec) (*exec.Cmd, error) { return mpsexec.Command(ctx, o.Self, s) }
	}
	return &Server{o: o, starting: map[string]bool{}}
}

// Serve listens on the socket and answers requests until ctx ends. The
// daemons it started keep running after: they are what it is for.
func (s *Server) Serve(ctx context.Context) error {
	l, err := listen(s.o.Socket)
	if err != nil {
		return err
	}
	return s.serveOn(ctx, l)
}

func (s *Server) serveOn(ctx context.Context, l socketListener) error {
	s.o.Log.Info("MPS launcher listening", "socket", s.o.Socket, "mpsRoot", s.o.Root, "driverRoot", s.o.DriverRoot)
	var wg sync.WaitGroup
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	for {
		c, err := l.Accept()
		if err != nil {
			wg.Wait()
			l.remove()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("MPS launcher: accepting on %s: %w", s.o.Socket, err)
		}
		wg.Go(func() { s.handle(ctx, c) })
	}
}

// socketListener is the launcher's socket, removed at the end only while
// it is still this listener's (another launcher may have taken the path).
type socketListener struct {
	net.Listener
	path string
	fi   os.FileInfo
}

func (l socketListener) remove() {
	if fi, err := os.Lstat(l.path); err == nil && os.SameFile(fi, l.fi) {
		_ = os.Remove(l.path)
	}
}

// listen binds a socket beside path, makes it root's only and renames it
// onto path: no client ever sees it with a wider mode, and a stale socket
// a killed launcher left is replaced.
func listen(path string) (socketListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return socketListener{}, fmt.Errorf("MPS launcher: socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != fs.ModeSocket {
		return socketListener{}, fmt.Errorf("MPS launcher: %s exists and is not a socket; remove it or choose another mpsLauncherSocket", path)
	}
	tmp := fmt.Sprintf("%s.%d", path, os.Getpid())
	_ = os.Remove(tmp)
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return socketListener{}, fmt.Errorf("MPS launcher: listening on %s: %w", path, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	fail := func(err error) (socketListener, error) {
		l.Close()
		_ = os.Remove(tmp)
		return socketListener{}, fmt.Errorf("MPS launcher: %s: %w", path, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	return socketListener{Listener: l, path: path, fi: fi}, nil
}

// maxRequest bounds a request: one UUID and its key.
const maxRequest = 4096

// handle answers one connection.
func (s *Server) handle(ctx context.Context, c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(s.o.Timeout + 5*time.Second))
	var req Request
	dec := json.NewDecoder(io.LimitReader(c, maxRequest))
	dec.DisallowUnknownFields()
	resp := Response{OK: true}
	if err := dec.Decode(&req); err != nil {
		resp = Response{Error: fmt.Sprintf("not a request: %v; send {\"gpu\":\"GPU-...\"}", err)}
	} else if req.Servers {
		resp = s.Servers(req.GPU)
	} else {
		resp = s.Start(ctx, req.GPU)
	}
	if err := json.NewEncoder(c).Encode(resp); err != nil {
		s.o.Log.Debug("MPS launcher: answering", "gpu", req.GPU, "err", err)
	}
}

// Servers lists the MPS servers running on the GPU with uuid.
func (s *Server) Servers(uuid string) Response {
	if err := ValidGPU(uuid); err != nil {
		return Response{Error: err.Error()}
	}
	pids, err := mpsd.ProcServers(s.o.ProcRoot, uuid)
	if err != nil {
		return Response{Error: err.Error()}
	}
	return Response{OK: true, Servers: pids}
}

// Start starts the control daemon of the GPU with uuid, as asked.
func (s *Server) Start(ctx context.Context, uuid string) Response {
	if err := ValidGPU(uuid); err != nil {
		return Response{Error: err.Error()}
	}
	log := s.o.Log.With("gpu", uuid)
	s.mu.Lock()
	busy := s.starting[uuid]
	s.starting[uuid] = true
	s.mu.Unlock()
	if busy {
		return Response{Error: fmt.Sprintf("a start of GPU %s's MPS control daemon is already under way", uuid)}
	}
	defer func() {
		s.mu.Lock()
		delete(s.starting, uuid)
		s.mu.Unlock()
	}()
	said, err := s.start(ctx, uuid)
	if err != nil {
		log.Warn("MPS control daemon did not start", "err", err, "output", said)
		return Response{Error: err.Error(), Output: said}
	}
	log.Info("MPS control daemon started")
	return Response{OK: true}
}

// start runs the control program with -d for the GPU and waits for it,
// bounded: -d returns once the daemon is forked, which stays in this
// process's tree.
func (s *Server) start(ctx context.Context, uuid string) (said string, err error) {
	dirs := map[string]string{}
	for _, which := range []string{sharing.MPSPipe, sharing.MPSLog, sharing.MPSShm} {
		dir := sharing.MPSDir(s.o.Root, uuid, which)
		fi, err := os.Lstat(dir)
		if err != nil || !fi.IsDir() {
			return "", fmt.Errorf("GPU %s has no MPS %s directory %s here; the plugin makes it before asking, so the launcher and the plugin must have the same mpsRoot (%s here) at the same host path", uuid, which, dir, s.o.Root)
		}
		dirs[which] = dir
	}
	// The plugin asked first; this holds against a race, or a plugin
	// that did not.
	if pids, err := mpsd.ProcServers(s.o.ProcRoot, uuid); err != nil || len(pids) > 0 {
		return "", fmt.Errorf("MPS server %v of an earlier control daemon still runs on GPU %s (%v); no daemon is started until it ends", pids, uuid, err)
	}
	spec, err := mpsexec.Locate(s.o.DriverRoot)
	if err != nil {
		return "", err
	}
	spec.DevRoot, spec.Pipe, spec.Log, spec.Shm = s.o.DevRoot, dirs[sharing.MPSPipe], dirs[sharing.MPSLog], dirs[sharing.MPSShm]
	spec.Env = append(spec.Env, "CUDA_VISIBLE_DEVICES="+uuid)
	spec.Args = []string{"-d"}
	cctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	cmd, err := s.o.Command(cctx, spec)
	if err != nil {
		return "", err
	}
	// A file, not a pipe: the forked daemon would hold a pipe open and
	// Wait would not return.
	out, err := os.Create(filepath.Join(dirs[sharing.MPSLog], "launcher-start.log"))
	if err != nil {
		return "", fmt.Errorf("MPS start log: %w", err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(out.Name())
		if errors.Is(cctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w (after %s)", err, s.o.Timeout)
		}
		return lastLine(b), fmt.Errorf("%s -d: %w", spec.Binary, err)
	}
	return "", nil
}
