package kubelet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
)

// HealthStatus is a device's health as the kubelet shows it.
type HealthStatus string

// The health states.
const (
	HealthStatusUnknown   HealthStatus = "Unknown"
	HealthStatusHealthy   HealthStatus = "Healthy"
	HealthStatusUnhealthy HealthStatus = "Unhealthy"
)

// DeviceHealth is one device's health.
type DeviceHealth struct {
	PoolName   string
	DeviceName string
	Health     HealthStatus
	// LastUpdated is when the health was last checked; zero sends none.
	LastUpdated time.Time
	// HealthCheckTimeout is how long the kubelet trusts this report
	// before it shows the device's health as unknown; zero is the
	// kubelet's default (30s).
	HealthCheckTimeout time.Duration
	// Message says why, for an unhealthy device.
	Message string
}

// DeviceHealthReport is the health of some or all of the driver's devices.
type DeviceHealthReport struct {
	Devices []DeviceHealth
}

// ErrHealthNotSupported, from WatchHealthStatus, ends the kubelet's watch
// with Unimplemented: the kubelet then stops asking.
var ErrHealthNotSupported = errors.New("device health reporting is not supported by this driver")

const (
	// kubeletHealthTimeout is the kubelet's HealthCheckTimeout default.
	kubeletHealthTimeout = 30 * time.Second
	// staleCheckInterval is how often a watch checks that the driver
	// still reports within the timeout it declared.
	staleCheckInterval = 10 * time.Second
)

// watchHealth answers NodeWatchResources (v1 and v1alpha1 alike: same
// messages) by relaying the plugin's reports until either side ends.
func (h *Helper) watchHealth(method string) grpcwire.StreamFunc {
	return func(ctx context.Context, req []byte, send func(grpcwire.Marshaler) error) error {
		if err := checkEmpty(req); err != nil {
			return grpcwire.Errorf(grpcwire.InvalidArgument, "NodeWatchResources: %v", err)
		}
		id := h.requestID.Add(1)
		h.log.Debug("DRA: kubelet watches device health", "method", method, "requestID", id)
		err := h.relayHealth(ctx, send)
		if err != nil && grpcwire.CodeOf(err) != grpcwire.Unimplemented && ctx.Err() == nil {
			h.log.Error("DRA: device health watch failed", "method", method, "requestID", id, "err", err)
		}
		return err
	}
}

func (h *Helper) relayHealth(ctx context.Context, send func(grpcwire.Marshaler) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reports := make(chan DeviceHealthReport)
	done := make(chan error, 1)
	go func() {
		defer close(reports)
		done <- h.plugin.WatchHealthStatus(ctx, reports)
	}()
	tick := time.NewTicker(h.staleCheck)
	defer tick.Stop()
	last, staleAfter, staleSaid := time.Now(), kubeletHealthTimeout, false
	for {
		select {
		case rep, ok := <-reports:
			if !ok {
				err := <-done
				if errors.Is(err, ErrHealthNotSupported) {
					return grpcwire.Errorf(grpcwire.Unimplemented, "%s", ErrHealthNotSupported.Error())
				}
				return err
			}
			last, staleAfter, staleSaid = time.Now(), shortestTimeout(rep), false
			if err := send(healthMessage(rep)); err != nil {
				// Let the plugin see the end and return before we do.
				cancel()
				for range reports {
				}
				<-done
				return err
			}
		case <-tick.C:
			if staleSaid || time.Since(last) <= staleAfter {
				continue
			}
			staleSaid = true
			err := fmt.Errorf("no device health report was sent for %s, the kubelet now reports device health as unknown: %w",
				time.Since(last).Truncate(time.Second), ErrRecoverable)
			h.plugin.HandleError(ctx, err, "device health reports are stale, WatchHealthStatus must re-send within each device's HealthCheckTimeout")
		}
	}
}

// shortestTimeout is how long the kubelet trusts rep: its devices'
// shortest HealthCheckTimeout.
func shortestTimeout(rep DeviceHealthReport) time.Duration {
	var least time.Duration
	for _, d := range rep.Devices {
		t := d.HealthCheckTimeout
		if t <= 0 {
			t = kubeletHealthTimeout
		}
		if least == 0 || t < least {
			least = t
		}
	}
	if least == 0 {
		return kubeletHealthTimeout
	}
	return least
}

func healthMessage(rep DeviceHealthReport) healthResponse {
	out := make(healthResponse, len(rep.Devices))
	for i, d := range rep.Devices {
		w := wireHealth{PoolName: d.PoolName, DeviceName: d.DeviceName, TimeoutSeconds: int64(d.HealthCheckTimeout / time.Second), Message: d.Message}
		switch d.Health {
		case HealthStatusHealthy:
			w.Health = 1
		case HealthStatusUnhealthy:
			w.Health = 2
		}
		if !d.LastUpdated.IsZero() {
			w.LastUpdated = d.LastUpdated.Unix()
		}
		out[i] = w
	}
	return out
}
