package deviceplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	// registerRetryMin is the first pause after a failed registration. It
	// is short because the usual failure is a dial that raced the
	// kubelet's listen(2), which succeeds a moment later.
	registerRetryMin = 2 * time.Millisecond
	registerTimeout  = 10 * time.Second
)

// serving names what a registration announces: one lifetime of our socket
// (gen) to one kubelet (epoch). A registration is made once per serving.
type serving struct {
	gen   uint64
	epoch uint64
}

// fileID tells a re-created file from the one it replaced: a new inode, or
// the same inode number reused at another time.
type fileID struct {
	ino   uint64
	ctime int64
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
	return fileID{ino: st.Ino, ctime: st.Ctim.Nano()}, nil
}

// registerLoop registers once per serving, retrying until it succeeds. It
// must not register twice with one kubelet: the kubelet refuses a second
// registration of a connected resource, and in doing so drops its record
// of the working connection. Nor may it register while our socket is gone:
// the kubelet would dial a missing socket and sit out gRPC's reconnect
// backoff. A kick during the retries restarts them at the shortest pause.
// Each failed run is logged once, so a node without a kubelet gets one
// line, not a line every few seconds.
func (s *Server) registerLoop(ctx context.Context, kick <-chan struct{}) {
	var done serving
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		}
		delay := registerRetryMin
		for attempt := 1; ; attempt++ {
			s.regMu.Lock()
			cur := s.served
			_, err := os.Stat(s.socketPath)
			s.regMu.Unlock()
			if cur == done || err != nil {
				// Announced already; or the kubelet wiped our socket, and
				// Run will serve again and kick.
				break
			}
			start := time.Now()
			if err = s.register(ctx); err == nil {
				done = cur
				// The socket that answered: a kubelet.sock created before
				// this point is the kubelet that has us already.
				s.regMu.Lock()
				s.registeredWith, _ = statID(s.kubelet)
				s.regMu.Unlock()
				s.log.Info("registered with kubelet", "attempts", attempt, "took", time.Since(start).String())
				break
			}
			if ctx.Err() != nil {
				return
			}
			if attempt == 1 {
				s.log.Warn("kubelet did not accept registration; retrying in the background", "kubelet", s.kubelet, "err", err)
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

// register makes one registration attempt. It builds its own connection
// each time and does not wait for readiness, so a refused dial fails at
// once instead of sitting out gRPC's reconnect backoff.
func (s *Server) register(ctx context.Context) error {
	conn, err := grpc.NewClient("passthrough:///"+s.kubelet,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
	if err != nil {
		return fmt.Errorf("connecting to kubelet at %s: %w", s.kubelet, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     SocketName(s.resource),
		ResourceName: s.resource,
		Options:      s.options(),
	})
	if err != nil {
		return fmt.Errorf("registering %s with kubelet at %s: %w", s.resource, s.kubelet, err)
	}
	return nil
}
