package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Serve's log messages the first look waits on (text format: msg="...").
const (
	msgEventsWatched = "watching NVML events (XIDs, double-bit ECC, recovery actions)"
	msgRegistered    = "registered with kubelet"
	msgHealthChanged = "GPU health changed"
)

// stopTimeout is how long serve gets to stop after SIGTERM.
const stopTimeout = 10 * time.Second

// serve is `gpu-device-plugin serve` running on the node, with the stand-in
// kubelet it registered with.
type serve struct {
	cmd  *exec.Cmd
	log  *logLines
	done chan struct{} // closed when the process has exited
	err  error         // Wait's answer, set before done is closed

	kubelet  *grpc.Server
	register chan *api.RegisterRequest
	conn     *grpc.ClientConn
	plugin   api.DevicePluginClient
}

// startServe starts serve with args on the node, and the stand-in
// kubelet's registration socket first, so serve registers at once.
func startServe(n *node, plugin string, args ...string) (*serve, error) {
	s := &serve{log: &logLines{}, done: make(chan struct{}), register: make(chan *api.RegisterRequest, 1)}
	l, err := net.Listen("unix", n.path("device-plugins", filepath.Base(api.KubeletSocket)))
	if err != nil {
		return nil, fmt.Errorf("the stand-in kubelet's socket: %w", err)
	}
	s.kubelet = grpc.NewServer()
	api.RegisterRegistrationServer(s.kubelet, registrar{got: s.register})
	go s.kubelet.Serve(l) // ends with Stop, in close

	s.cmd = exec.Command(plugin, append([]string{"serve"}, args...)...)
	s.cmd.Env = n.env(true)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	// serve dies with this process, even one killed without a chance to stop it.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.kubelet.Stop()
		return nil, fmt.Errorf("starting serve: %w", err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	return s, nil
}

// registrar is the stand-in kubelet's Registration service: it hands each
// request to the first look, which then connects as the kubelet does.
type registrar struct {
	api.UnimplementedRegistrationServer
	got chan<- *api.RegisterRequest
}

func (r registrar) Register(_ context.Context, req *api.RegisterRequest) (*api.Empty, error) {
	select {
	case r.got <- req:
	default: // one registration is all the first look needs
	}
	return &api.Empty{}, nil
}

// connect waits for serve to register, then dials its socket, as the
// kubelet does on a registration.
func (s *serve) connect(ctx context.Context, dir string) (*api.RegisterRequest, error) {
	var req *api.RegisterRequest
	select {
	case req = <-s.register:
	case <-s.done:
		return nil, fmt.Errorf("serve exited before registering: %v", s.err)
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for serve to register: %w", context.Cause(ctx))
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, req.Endpoint),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dialling serve: %w", err)
	}
	s.conn, s.plugin = conn, api.NewDevicePluginClient(conn)
	return req, nil
}

// stop ends serve with SIGTERM (SIGKILL after stopTimeout) and the stand-in
// kubelet, and returns an error if serve did not exit cleanly.
func (s *serve) stop() error {
	if s.conn != nil {
		s.conn.Close()
	}
	s.kubelet.Stop()
	select {
	case <-s.done:
		return fmt.Errorf("serve exited before it was stopped: %v", s.err)
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		if s.err != nil {
			return fmt.Errorf("serve exited after SIGTERM: %w", s.err)
		}
		return nil
	case <-time.After(stopTimeout):
		s.cmd.Process.Kill()
		<-s.done
		return fmt.Errorf("serve still running %v after SIGTERM; killed", stopTimeout)
	}
}

// logLines is serve's output, line by line, for waiting on a line.
type logLines struct {
	mu      sync.Mutex
	partial []byte
	lines   []string
	changed chan struct{} // closed and replaced at every new line
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	added := false
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
		added = true
	}
	if added && l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
	return len(p), nil
}

// String is the whole log so far.
func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n") + string(l.partial)
}

// wait returns the first line with message msg that ok accepts (nil
// accepts any), or an error once ctx ends or exited is closed.
func (l *logLines) wait(ctx context.Context, exited <-chan struct{}, msg string, ok func(string) bool) (string, error) {
	for from := 0; ; {
		l.mu.Lock()
		for ; from < len(l.lines); from++ {
			if line := l.lines[from]; hasMsg(line, msg) && (ok == nil || ok(line)) {
				l.mu.Unlock()
				return line, nil
			}
		}
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-exited:
			return "", fmt.Errorf("serve exited before logging %q", msg)
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for serve to log %q: %w", msg, context.Cause(ctx))
		}
	}
}

// hasMsg says whether a text-format log line has message msg.
func hasMsg(line, msg string) bool {
	return strings.Contains(line, ` msg="`+msg+`"`) || strings.Contains(line+" ", " msg="+msg+" ")
}

// short is a log line without its time, which says nothing here.
func short(line string) string {
	if strings.HasPrefix(line, "time=") {
		if _, rest, ok := strings.Cut(line, " "); ok {
			return rest
		}
	}
	return line
}

// listWatch is serve's ListAndWatch stream, as the kubelet reads it.
type listWatch struct {
	lists chan []*api.Device
	errc  chan error
}

func (s *serve) listAndWatch(ctx context.Context) (*listWatch, error) {
	stream, err := s.plugin.ListAndWatch(ctx, &api.Empty{})
	if err != nil {
		return nil, fmt.Errorf("ListAndWatch: %w", err)
	}
	w := &listWatch{lists: make(chan []*api.Device), errc: make(chan error, 1)}
	go func() { // ends with ctx, which ends the stream
		for {
			resp, err := stream.Recv()
			if err != nil {
				w.errc <- err
				return
			}
			select {
			case w.lists <- resp.Devices:
			case <-ctx.Done():
				return
			}
		}
	}()
	return w, nil
}

// next waits for a list ok accepts.
func (w *listWatch) next(ctx context.Context, what string, ok func([]*api.Device) bool) ([]*api.Device, error) {
	for {
		select {
		case l := <-w.lists:
			if ok(l) {
				return l, nil
			}
		case err := <-w.errc:
			return nil, fmt.Errorf("ListAndWatch ended waiting for %s: %w", what, err)
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for ListAndWatch to show %s: %w", what, context.Cause(ctx))
		}
	}
}

// allocate is the kubelet's Allocate for one container.
func (s *serve) allocate(ctx context.Context, ids []string) (*api.ContainerAllocateResponse, error) {
	resp, err := s.plugin.Allocate(ctx, &api.AllocateRequest{
		ContainerRequests: []*api.ContainerAllocateRequest{{DevicesIds: ids}},
	})
	if err != nil {
		return nil, err
	}
	if len(resp.ContainerResponses) != 1 {
		return nil, errors.New("allocate: not one container response for one container")
	}
	return resp.ContainerResponses[0], nil
}

// preferred is the kubelet's GetPreferredAllocation for one container.
func (s *serve) preferred(ctx context.Context, available []string, size int) ([]string, error) {
	resp, err := s.plugin.GetPreferredAllocation(ctx, &api.PreferredAllocationRequest{
		ContainerRequests: []*api.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: available, AllocationSize: int32(size)}},
	})
	if err != nil {
		return nil, err
	}
	if len(resp.ContainerResponses) != 1 {
		return nil, errors.New("preferred allocation: not one container response for one container")
	}
	return resp.ContainerResponses[0].DeviceIDs, nil
}

// failed adds to err what serve wrote, or why it exited.
func (s *serve) failed(err error) error {
	select {
	case <-s.done:
		return fmt.Errorf("%w\nserve exited (%v); its output:\n%s", err, s.err, s.log)
	default:
		return fmt.Errorf("%w\nserve's log:\n%s", err, s.log)
	}
}
