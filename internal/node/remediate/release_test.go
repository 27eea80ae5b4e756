package remediate

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
)

// needsHuman brings GPU-1 (two MIG devices) to needsHuman: its reset
// fails.
func (r *rig) needsHuman() {
	r.t.Helper()
	r.svc.Facts("GPU-1", resetFault())
	<-r.res.resets
	r.res.result <- errors.New("the reset failed")
	<-r.results
	r.wantState("GPU-1", remedy.StateNeedsHuman)
}

// A human's release: on Run's goroutine the GPU is given back (its units'
// health passes again, its MPS daemon may start, an Event says so) and
// the file no longer keeps it out. A GPU in another state, or one the
// node does not know, is refused and nothing changes.
func TestRelease(t *testing.T) {
	st := &store{}
	r := newRig(t, remedy.DefaultPolicy(), st, false)
	r.run()
	r.needsHuman()
	ctx := context.Background()

	_, err := r.svc.Release(ctx, "GPU-0")
	var nt *remedy.NotTerminalError
	if !errors.As(err, &nt) || nt.State != remedy.StateServing {
		t.Fatalf("releasing a serving GPU: %v, want its state refused", err)
	}
	if _, err := r.svc.Release(ctx, "GPU-nope"); !errors.Is(err, remedy.ErrUnknownGPU) || !strings.Contains(err.Error(), "GPU-nope") {
		t.Fatalf("releasing an unknown GPU: %v", err)
	}

	before, err := r.svc.Release(ctx, "GPU-1")
	if err != nil {
		t.Fatal(err)
	}
	if before.State != remedy.StateNeedsHuman || !strings.Contains(before.Reason, "the reset failed") {
		t.Errorf("status before the release: %+v", before)
	}
	r.wantState("GPU-1", remedy.StateServing)
	r.wantHealth("MIG-a", true, "")
	r.wantHealth("MIG-b", true, "")
	r.wantCalls("mps start GPU-1", "event GPU-1 GPUGivenBack", "metric state GPU-1 serving")
	var saved remedy.Saved
	if _, err := st.Load(&saved); err != nil {
		t.Fatal(err)
	}
	for _, g := range saved.GPUs {
		if g.UUID == "GPU-1" && g.State != remedy.StateServing {
			t.Errorf("saved as %s after the release", g.State)
		}
	}

	r.stop()
	if _, err := r.svc.Release(ctx, "GPU-1"); !errors.Is(err, ErrStopped) {
		t.Errorf("after Run: %v, want ErrStopped", err)
	}
}

// serveSocket serves h on a Unix socket in a temporary directory.
func serveSocket(t *testing.T, h http.Handler) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "health.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return path
}

// The endpoint on the socket, through the Client: each refusal comes back
// as the error a caller tells apart, a release as the GPU's status before.
func TestEndpoint(t *testing.T) {
	ctx := context.Background()
	ep := &Endpoint{}
	c := Client{Socket: serveSocket(t, ep.Handler())}

	if _, err := c.Release(ctx, "GPU-1"); !errors.Is(err, ErrStarting) {
		t.Errorf("before the service: %v, want ErrStarting", err)
	}
	ep.Off("remediation.enabled is false")
	if _, err := c.Status(ctx); !errors.Is(err, ErrOff) || !strings.Contains(err.Error(), "remediation.enabled is false") {
		t.Errorf("off: %v", err)
	}

	r := newRig(t, remedy.DefaultPolicy(), &store{}, false)
	r.run()
	r.needsHuman()
	ep.Serve(r.svc)
	all, err := c.Status(ctx)
	if err != nil || len(all) != 2 || all[1].GPU != "GPU-1" || all[1].State != remedy.StateNeedsHuman {
		t.Fatalf("status: %+v, %v", all, err)
	}
	if _, err := c.Release(ctx, "GPU-nope"); !errors.Is(err, remedy.ErrUnknownGPU) || !strings.Contains(err.Error(), "GPU-nope") {
		t.Errorf("unknown GPU: %v", err)
	}
	var nt *remedy.NotTerminalError
	if _, err := c.Release(ctx, "GPU-0"); !errors.As(err, &nt) || nt.State != remedy.StateServing || nt.GPU != "GPU-0" {
		t.Errorf("serving GPU: %v", err)
	}
	st, err := c.Release(ctx, "GPU-1")
	if err != nil || st.State != remedy.StateNeedsHuman {
		t.Fatalf("release: %+v, %v", st, err)
	}
	r.wantState("GPU-1", remedy.StateServing)

	// A body that is not one GPU is refused before anything is asked; a
	// GET on the release, or a path the endpoint does not have, is not
	// answered.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", c.Socket)
	}}}
	for _, tc := range []struct {
		method, path, body string
		want               int
	}{
		{http.MethodPost, PathRelease, "", http.StatusBadRequest},
		{http.MethodPost, PathRelease, "{}", http.StatusBadRequest},
		{http.MethodPost, PathRelease, `{"gpu": "GPU-1", "force": true}`, http.StatusBadRequest},
		{http.MethodPost, PathRelease, "GPU-1", http.StatusBadRequest},
		{http.MethodGet, PathRelease, "", http.StatusMethodNotAllowed},
		{http.MethodPost, PathStatus, "", http.StatusMethodNotAllowed},
	} {
		req, _ := http.NewRequest(tc.method, "http://plugin"+tc.path, strings.NewReader(tc.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s %q: %s, want %d", tc.method, tc.path, tc.body, resp.Status, tc.want)
		}
	}
}

// A plugin of a release without the endpoint answers 404 in plain text:
// the Client says so rather than a JSON error.
func TestClientOfAnOlderPlugin(t *testing.T) {
	c := Client{Socket: serveSocket(t, http.NewServeMux())}
	if _, err := c.Release(context.Background(), "GPU-1"); err == nil || !strings.Contains(err.Error(), "does not answer /remediation/release") {
		t.Errorf("err %v", err)
	}
}
