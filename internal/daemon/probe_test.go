package daemon

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/remediate"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/probe"
)

// heldKubelet takes registrations only once let is closed.
type heldKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	asked chan string
	let   chan struct{}
}

func (k *heldKubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.asked <- r.ResourceName
	select {
	case <-k.let:
		return &pluginapi.Empty{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// The readiness probe follows the plugin: not ready while NVML is
// missing, nor while the kubelet has not taken the registration; ready
// once it has. The liveness probe says live throughout.
func TestProbesFollowDriverAndRegistration(t *testing.T) {
	cfg := testConfig(t)
	cfg.HealthSocket = filepath.Join(t.TempDir(), "health.sock")
	cfg.Remediation.Enabled = false
	ln, err := net.Listen("unix", filepath.Join(cfg.DevicePluginDir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &heldKubelet{asked: make(chan string, 4), let: make(chan struct{})}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)

	var attempts atomic.Int32
	retried := make(chan struct{})
	driver := make(chan struct{})
	open := func(string) (nvml.Library, error) {
		switch n := attempts.Add(1); {
		case n == 2:
			close(retried) // the first failure was reported before this
			<-driver
		case n > 2:
			return nvmltest.NewDGXA100(), nil
		}
		return nil, nvml.ErrNoDriver
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, open, nil) }()
	ask := func(what string) (string, error) {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		defer acancel()
		return probe.Ask(actx, cfg.HealthSocket, what)
	}

	<-retried
	text, err := ask("readyz")
	if !errors.Is(err, probe.ErrNotOK) || !strings.Contains(text, "GPUs: NVML did not load") {
		t.Errorf("without a driver: readyz %q, %v; want not ready, naming NVML", text, err)
	}
	if text, err := ask("livez"); err != nil {
		t.Errorf("without a driver: livez %q, %v; want live", text, err)
	}
	// The same socket answers for the remediation, which is off.
	if _, err := (remediate.Client{Socket: cfg.HealthSocket}).Status(ctx); !errors.Is(err, remediate.ErrOff) || !strings.Contains(err.Error(), "remediation.enabled is false") {
		t.Errorf("remediation status with remediation off: %v", err)
	}
	close(driver)

	if r := <-k.asked; r != "nvidia.com/gpu" {
		t.Fatalf("registered %q", r)
	}
	text, err = ask("readyz")
	if !errors.Is(err, probe.ErrNotOK) || !strings.Contains(text, "nvidia.com/gpu: not yet registered with the kubelet") || strings.Contains(text, "GPUs:") {
		t.Errorf("registration pending: readyz %q, %v; want only the resource named", text, err)
	}
	close(k.let)
	// The plugin opens the gate once Register returns to it: ask as the
	// kubelet does, until it says ready.
	deadline := time.Now().Add(10 * time.Second)
	for {
		text, err = ask("readyz")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("registered: readyz still %q, %v", text, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if text != "ok" {
		t.Errorf("ready: %q", text)
	}
	if text, err := ask("livez"); err != nil || text != "ok" {
		t.Errorf("serving: livez %q, %v", text, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// With remediation on, the health socket answers for it once the GPUs are
// found: every GPU serving, and a release of one that is not out for a
// human refused with its state. The probes answer as before.
func TestRemediationOnTheHealthSocket(t *testing.T) {
	cfg := testConfig(t)
	cfg.HealthSocket = filepath.Join(t.TempDir(), "health.sock")
	cfg.Remediation.Enabled = true
	startKubelet(t, cfg.DevicePluginDir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, func(string) (nvml.Library, error) { return nvmltest.NewDGXA100(), nil }, nil)
	}()
	c := remediate.Client{Socket: cfg.HealthSocket}
	var all []remedy.Status
	deadline := time.Now().Add(10 * time.Second)
	for {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		all, err = c.Status(actx)
		acancel()
		if err == nil {
			break
		}
		if !errors.Is(err, remediate.ErrStarting) && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
			t.Fatalf("remediation status: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(all) != 8 || all[0].State != remedy.StateServing {
		t.Fatalf("status %+v", all)
	}
	var nt *remedy.NotTerminalError
	if _, err := c.Release(ctx, all[0].GPU); !errors.As(err, &nt) || nt.State != remedy.StateServing {
		t.Errorf("release of a serving GPU: %v", err)
	}
	if _, err := probe.Ask(ctx, cfg.HealthSocket, "livez"); err != nil {
		t.Errorf("livez: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
