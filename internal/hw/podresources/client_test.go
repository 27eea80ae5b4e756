package podresources_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	prt "github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources/podresourcestest"
)

const (
	gpuRes = "nvidia.com/gpu"
	nicRes = "example.com/rdma_numa0"
	driver = "gpu-device-plugin.github.io"
)

func TestHolders(t *testing.T) {
	srv := prt.Start(t,
		prt.Pod("ml", "trainer-0",
			prt.Container("main", prt.Devices(gpuRes, "GPU-a", "GPU-b"), prt.Devices(nicRes, "0000:18:00.0")),
			prt.Container("sidecar", prt.Devices(gpuRes, "GPU-b")),
		),
		prt.Pod("infer", "server-1",
			// A claim shared by two containers, and one device listed
			// by two requests of one claim.
			prt.ClaimContainer("a", prt.Claim("infer", "gpus", driver, "node-1", "gpu-2", "gpu-2", "nic-0000-4f-00-0")),
			prt.ClaimContainer("b", prt.Claim("infer", "gpus", driver, "node-1", "gpu-2")),
			// Another driver's device of the same name.
			prt.ClaimContainer("c", prt.Claim("infer", "other", "example.com", "node-1", "gpu-3")),
		),
	)
	h, err := podresources.Client{Socket: srv.Socket}.Holders(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	main := podresources.Holder{Namespace: "ml", Pod: "trainer-0", Container: "main"}
	side := podresources.Holder{Namespace: "ml", Pod: "trainer-0", Container: "sidecar"}
	a := podresources.Holder{Namespace: "infer", Pod: "server-1", Container: "a"}
	b := podresources.Holder{Namespace: "infer", Pod: "server-1", Container: "b"}
	tests := []struct {
		name string
		got  []podresources.Holder
		want []podresources.Holder
	}{
		{"one holder", h.Device(gpuRes, "GPU-a"), []podresources.Holder{main}},
		{"two containers", h.Device(gpuRes, "GPU-b"), []podresources.Holder{main, side}},
		{"NIC", h.Device(nicRes, "0000:18:00.0"), []podresources.Holder{main}},
		{"other resource, same ID", h.Device(nicRes, "GPU-a"), nil},
		{"nobody", h.Device(gpuRes, "GPU-z"), nil},
		{"DRA shared claim, listed twice", h.DRADevice(driver, "node-1", "gpu-2"), []podresources.Holder{a, b}},
		{"DRA NIC", h.DRADevice(driver, "node-1", "nic-0000-4f-00-0"), []podresources.Holder{a}},
		{"DRA other pool", h.DRADevice(driver, "node-2", "gpu-2"), nil},
		{"DRA other driver's device", h.DRADevice(driver, "node-1", "gpu-3"), nil},
	}
	for _, tt := range tests {
		if !slices.Equal(tt.got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if got := main.String(); got != "ml/trainer-0/main" {
		t.Errorf("String() = %q", got)
	}
	if got := podresources.Merge(h.Device(gpuRes, "GPU-b"), h.Device(gpuRes, "GPU-a"), nil); !slices.Equal(got, []podresources.Holder{main, side}) {
		t.Errorf("Merge = %v", got)
	}
	// Every name of one device at once: replica IDs and a DRA device.
	names := podresources.Names{Resource: gpuRes, IDs: []string{"GPU-a", "GPU-b"}, Driver: driver, Pool: "node-1", DRADevice: "gpu-2"}
	if got := h.Of(names); !slices.Equal(got, []podresources.Holder{a, b, main, side}) {
		t.Errorf("Of(%+v) = %v", names, got)
	}
	if got := h.Of(podresources.Names{Resource: gpuRes, IDs: []string{"GPU-z"}, Driver: driver, Pool: "node-1"}); got != nil {
		t.Errorf("Of without a DRA name, held by nobody = %v", got)
	}
}

func TestZeroHoldersHoldNothing(t *testing.T) {
	var h podresources.Holders
	if h.Device(gpuRes, "GPU-a") != nil || h.DRADevice(driver, "p", "gpu-0") != nil {
		t.Error("the zero Holders holds something")
	}
}

func TestUnavailable(t *testing.T) {
	dir := t.TempDir()
	// A socket file nobody listens on: what a stopped kubelet leaves.
	stale := filepath.Join(shortDir(t), "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	notSocket := filepath.Join(dir, "file")
	if err := os.WriteFile(notSocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, socket string
		is           error
	}{
		{name: "missing", socket: filepath.Join(dir, "kubelet.sock"), is: fs.ErrNotExist},
		{name: "nothing listening", socket: stale},
		{name: "not a socket", socket: notSocket},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := podresources.Client{Socket: tt.socket}.Holders(context.Background())
			if !errors.Is(err, podresources.ErrUnavailable) {
				t.Fatalf("err = %v, want ErrUnavailable", err)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("err = %v, want it to wrap %v", err, tt.is)
			}
			if !strings.Contains(err.Error(), tt.socket) {
				t.Errorf("err = %v, does not name %s", err, tt.socket)
			}
		})
	}
}

func TestUnreadableSocket(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads any socket")
	}
	srv := prt.Start(t)
	dir := filepath.Dir(srv.Socket)
	if err := os.Chmod(dir, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o700) })
	_, err := podresources.Client{Socket: srv.Socket}.Holders(context.Background())
	if !errors.Is(err, podresources.ErrUnavailable) || !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("err = %v, want ErrUnavailable wrapping a permission error", err)
	}
}

func TestServerError(t *testing.T) {
	srv := prt.Start(t)
	srv.Fail(status.Error(codes.Internal, "kubelet broke"))
	_, err := podresources.Client{Socket: srv.Socket}.Holders(context.Background())
	if err == nil || errors.Is(err, podresources.ErrUnavailable) {
		t.Fatalf("err = %v, want an error that is not ErrUnavailable", err)
	}
	if grpcwire.CodeOf(err) != grpcwire.Internal || !strings.Contains(err.Error(), "kubelet broke") {
		t.Errorf("err = %v, want the server's Internal error wrapped", err)
	}
	srv.Set()
	if _, err := (podresources.Client{Socket: srv.Socket}).Holders(context.Background()); err != nil {
		t.Errorf("after the server recovered: %v", err)
	}
}

func TestCancelledContext(t *testing.T) {
	srv := prt.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := (podresources.Client{Socket: srv.Socket}).Holders(ctx); err == nil {
		t.Fatal("a cancelled context listed")
	}
}

// shortDir is a directory whose paths fit a unix socket's 108 bytes.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "podres")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
