package kubelet

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

// upstreamRollingUpdateSocket is the kubeletplugin helper's own name.
func upstreamRollingUpdateSocket(dir, driver string, uid types.UID) string {
	return kubeletplugin.RollingUpdateRegistrarSocketFile(dir, driver, uid)
}

// healthVersion watches health as the kubelet does with one version of
// the service (v1alpha1 through k8s.io/kubelet's conversion to v1).
type healthVersion struct {
	name  string
	watch func(ctx context.Context, t *testing.T, conn *grpc.ClientConn) func() (*drahealthv1.NodeWatchResourcesResponse, error)
}

var healthVersions = []healthVersion{
	{name: "v1", watch: func(ctx context.Context, t *testing.T, conn *grpc.ClientConn) func() (*drahealthv1.NodeWatchResourcesResponse, error) {
		return watchWith(ctx, t, drahealthv1.NewDRAResourceHealthClient(conn))
	}},
	{name: "v1alpha1", watch: func(ctx context.Context, t *testing.T, conn *grpc.ClientConn) func() (*drahealthv1.NodeWatchResourcesResponse, error) {
		return watchWith(ctx, t, drahealthv1.V1Alpha1ClientWrapper{Client: drahealthv1alpha1.NewDRAResourceHealthClient(conn)})
	}},
}

func watchWith(ctx context.Context, t *testing.T, c drahealthv1.DRAResourceHealthClient) func() (*drahealthv1.NodeWatchResourcesResponse, error) {
	t.Helper()
	s, err := c.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		return func() (*drahealthv1.NodeWatchResourcesResponse, error) { return nil, err }
	}
	return s.Recv
}

// upstreamHealth is r as the helper's healthServerBridge sends it.
func upstreamHealth(r DeviceHealthReport) *drahealthv1.NodeWatchResourcesResponse {
	out := &drahealthv1.NodeWatchResourcesResponse{Devices: []*drahealthv1.DeviceHealth{}}
	for _, d := range r.Devices {
		h := drahealthv1.HealthStatus_UNKNOWN
		switch d.Health {
		case HealthStatusHealthy:
			h = drahealthv1.HealthStatus_HEALTHY
		case HealthStatusUnhealthy:
			h = drahealthv1.HealthStatus_UNHEALTHY
		}
		var last int64
		if !d.LastUpdated.IsZero() {
			last = d.LastUpdated.Unix()
		}
		out.Devices = append(out.Devices, &drahealthv1.DeviceHealth{
			Device: &drahealthv1.DeviceIdentifier{PoolName: d.PoolName, DeviceName: d.DeviceName},
			Health: h, LastUpdatedTime: last, HealthCheckTimeoutSeconds: int64(d.HealthCheckTimeout / time.Second), Message: d.Message,
		})
	}
	return out
}
