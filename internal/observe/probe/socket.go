package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Listen listens on the Unix socket path, replacing a socket an earlier
// process left (SIGKILL leaves it) but no other kind of file. The socket is
// for the probe command in the same container: mode 0600.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("health socket %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("health socket %s: a %s is there, not a socket; remove it or set healthSocket (--health-socket) elsewhere", path, fi.Mode().Type())
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("health socket %s: removing the one an earlier process left: %w", path, err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("health socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("health socket %s: %w", path, err)
	}
	return ln, nil
}

// Serve answers on ln until ctx ends, then closes it (and so removes the
// socket file).
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("health socket: %w", err)
	}
	return nil
}

// ErrNotOK is wrapped by Ask's error when the plugin answered "not live"
// or "not ready", as opposed to not answering at all.
var ErrNotOK = errors.New("plugin answered not ok")

// Ask asks the plugin on socket path whether it is live ("livez") or ready
// ("readyz"), and returns its answer's text.
func Ask(ctx context.Context, path, what string) (string, error) {
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://plugin/"+what, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("asking the plugin on %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", fmt.Errorf("reading the plugin's answer on %s: %w", path, err)
	}
	text := strings.TrimSpace(string(b))
	if resp.StatusCode != http.StatusOK {
		return text, fmt.Errorf("%w: %s", ErrNotOK, text)
	}
	return text, nil
}
