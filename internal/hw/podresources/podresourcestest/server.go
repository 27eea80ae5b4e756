// Package podresourcestest serves a fake kubelet PodResources API on a
// unix socket, for tests here and in packages that show who holds a
// device.
package podresourcestest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
)

// Server answers List with the pods it was given, or with an error.
type Server struct {
	v1.UnimplementedPodResourcesListerServer

	// Socket is the path to dial.
	Socket string

	mu   sync.Mutex
	pods []*v1.PodResources
	err  error
	// lists counts List calls.
	lists int
}

// Start serves pods on a socket in a fresh temporary directory until the
// test ends.
func Start(t testing.TB, pods ...*v1.PodResources) *Server {
	t.Helper()
	// Not t.TempDir(): a unix socket path must stay under 108 bytes, and
	// test names make those long.
	dir, err := os.MkdirTemp("", "podres")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &Server{Socket: filepath.Join(dir, "kubelet.sock"), pods: pods}
	ln, err := net.Listen("unix", s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	v1.RegisterPodResourcesListerServer(srv, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return s
}

// Set replaces the pods List answers with, and clears any error.
func (s *Server) Set(pods ...*v1.PodResources) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods, s.err = pods, nil
}

// Fail makes List answer err (a gRPC status error, for a code).
func (s *Server) Fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// Lists is how many times List was called.
func (s *Server) Lists() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}

// List implements v1.PodResourcesListerServer.
func (s *Server) List(context.Context, *v1.ListPodResourcesRequest) (*v1.ListPodResourcesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists++
	if s.err != nil {
		return nil, s.err
	}
	return &v1.ListPodResourcesResponse{PodResources: s.pods}, nil
}

// Pod is one pod with its containers.
func Pod(namespace, name string, containers ...*v1.ContainerResources) *v1.PodResources {
	return &v1.PodResources{Namespace: namespace, Name: name, Containers: containers}
}

// Container is one container holding device-plugin devices.
func Container(name string, devices ...*v1.ContainerDevices) *v1.ContainerResources {
	return &v1.ContainerResources{Name: name, Devices: devices}
}

// ClaimContainer is one container holding DRA claims.
func ClaimContainer(name string, claims ...*v1.DynamicResource) *v1.ContainerResources {
	return &v1.ContainerResources{Name: name, DynamicResources: claims}
}

// Devices is device IDs of one device-plugin resource.
func Devices(resource string, ids ...string) *v1.ContainerDevices {
	return &v1.ContainerDevices{ResourceName: resource, DeviceIds: ids}
}

// Claim is a claim's devices, all from one driver and pool.
func Claim(namespace, name, driver, pool string, devices ...string) *v1.DynamicResource {
	d := &v1.DynamicResource{ClaimNamespace: namespace, ClaimName: name}
	for _, dev := range devices {
		d.ClaimResources = append(d.ClaimResources, &v1.ClaimResource{DriverName: driver, PoolName: pool, DeviceName: dev})
	}
	return d
}

// Decode is pods as the plugin's client reads them from the wire: encoded
// by the kubelet's generated code, decoded by podresources.DecodeList.
func Decode(t testing.TB, pods ...*v1.PodResources) []podresources.Pod {
	t.Helper()
	wire, err := proto.Marshal(&v1.ListPodResourcesResponse{PodResources: pods})
	if err != nil {
		t.Fatal(err)
	}
	out, err := podresources.DecodeList(wire)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
