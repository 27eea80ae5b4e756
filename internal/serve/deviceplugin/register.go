package deviceplugin

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
	api "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin/v1beta1"
)

const (
	// registerRetryMin is the first pause after a failed registration. It
	// is short because the usual failure is a dial that raced the
	// kubelet's listen(2), which succeeds a moment later.
	registerRetryMin = 2 * time.Millisecond
	registerTimeout  = 10 * time.Second
)

// fileID tells a re-created file from the one it replaced: the device and
// inode, and the change time in case the inode number was reused.
type fileID struct {
	dev, ino uint64
	ctime    int64
}

func statID(path string) (fileID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, fmt.Errorf("stat %s: no inode", path)
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim.Nano()}, nil
}

// serving is one lifetime of our socket: Run makes a new one each time it
// listens, and ends its ctx when it stops serving it.
type serving struct {
	gen    uint64
	socket fileID // the socket file this serving created
	ctx    context.Context
}

// announced is what the register loop last told a kubelet: which serving,
// to which kubelet.sock.
type announced struct {
	gen     uint64
	kubelet fileID
}

// registerLoop is the only goroutine that registers, and it registers once
// per serving and kubelet.sock: it decides from what it sees on disk when
// kicked, not from the events that kicked it, so the two events of one
// kubelet start (our socket wiped, kubelet.sock created), in whatever order
// and however late they are handled, add up to one registration.
//
// It must not register twice with one kubelet: the kubelet refuses a second
// registration of a connected socket, and in doing so drops its record of
// the working connection. Nor may it register while our socket is gone:
// the kubelet would dial a missing socket for up to ten seconds. A kick
// during the retries restarts them at the shortest pause. Each failed run
// is logged once, so a node without a kubelet gets one line, not a line
// every few seconds.
func (s *Server) registerLoop(ctx context.Context, kick <-chan struct{}) {
	var last announced
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		}
		delay := registerRetryMin
		for attempt := 1; ; attempt++ {
			cur, ok := s.currentServing()
			if !ok {
				// The kubelet wiped our socket: Run serves again and kicks.
				s.ready("our socket is gone (a kubelet restart wipes it); serving and registering again")
				break
			}
			kid, err := statID(s.kubelet)
			if err == nil && (announced{cur.gen, kid}) == last {
				break
			}
			if err == nil {
				start := time.Now()
				if err = s.register(cur.ctx); err == nil {
					// Which kubelet took it: the one listening now. A
					// kubelet that started in between wiped our socket,
					// so a new serving announces itself to it anyway.
					after, _ := statID(s.kubelet)
					last = announced{gen: cur.gen, kubelet: after}
					s.log.Info("registered with kubelet", "attempts", attempt, "took", time.Since(start).String())
					s.ready("")
					break
				}
			} else {
				err = fmt.Errorf("no kubelet socket: %w", err)
			}
			if ctx.Err() != nil {
				return
			}
			if cur.ctx.Err() != nil {
				// This serving ended while we registered it; the next
				// one kicks.
				break
			}
			if attempt == 1 {
				s.log.Warn("kubelet did not accept registration; retrying in the background", "kubelet", s.kubelet, "err", err)
				s.ready(fmt.Sprintf("the kubelet did not accept registration: %v", err))
			}
			select {
			case <-ctx.Done():
				return
			case <-kick:
				delay = registerRetryMin
			case <-time.After(delay):
				delay = min(2*delay, s.retryMax)
			}
		}
	}
}

// currentServing returns the current serving and whether its socket is
// still the file it created.
func (s *Server) currentServing() (serving, bool) {
	s.regMu.Lock()
	cur := s.serving
	s.regMu.Unlock()
	if cur.ctx == nil || cur.ctx.Err() != nil {
		return cur, false
	}
	id, err := statID(s.socketPath)
	return cur, err == nil && id == cur.socket
}

// register makes one registration attempt. It builds its own connection
// each time and does not wait for readiness, so a refused dial fails at
// once instead of sitting out gRPC's reconnect backoff.
func (s *Server) register(ctx context.Context) error {
	conn := grpcwire.NewClient(s.kubelet, 0)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	opts := s.options()
	_, err := conn.Call(ctx, api.MethodRegister, api.RegisterRequest{
		Version:      api.Version,
		Endpoint:     SocketName(s.resource),
		ResourceName: s.resource,
		Options:      &opts,
	})
	if err != nil {
		return fmt.Errorf("registering %s with kubelet at %s: %w", s.resource, s.kubelet, err)
	}
	return nil
}
