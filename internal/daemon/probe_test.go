package daemon

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
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
