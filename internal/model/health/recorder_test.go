package health

import (
	"reflect"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
)

// callLog is a Recorder that notes each call.
type callLog []string

func (c *callLog) Health(device string, healthy bool, reason string) {
	*c = append(*c, "health "+device+" "+healthState(healthy)+" "+reason)
}

func (c *callLog) Transition(device string, healthy bool, reason string) {
	*c = append(*c, "transition "+device+" "+healthState(healthy)+" "+reason)
}

func healthState(h bool) string {
	if h {
		return "healthy"
	}
	return "unhealthy"
}

// The watcher tells its Recorder every device's state at start and at each
// change of state or reason, and counts a transition only when the state
// changes: a reason added to an unhealthy device is no transition.
func TestWatcherFeedsRecorder(t *testing.T) {
	var calls callLog
	s := newSampler(2)
	w, err := NewWatcher(policy.Default(), []string{"GPU-0", "GPU-1"}, s, &recorder{}, &calls, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := (callLog{"health GPU-0 healthy ", "health GPU-1 healthy "}); !reflect.DeepEqual(calls, want) {
		t.Fatalf("at start %q, want %q", calls, want)
	}
	calls = nil
	w.Event(nvml.Event{GPU: 1, Kind: nvml.EventXID, XID: 79})
	if want := (callLog{"transition GPU-1 unhealthy xid=79", "health GPU-1 unhealthy xid=79"}); !reflect.DeepEqual(calls, want) {
		t.Fatalf("after XID 79 %q, want %q", calls, want)
	}
	calls = nil
	s.set(1, func(s *nvml.Sample) { s.TempC = 95 })
	w.Poll()
	if want := (callLog{"health GPU-1 unhealthy xid=79, thermal=95C>=slowdown 90C"}); !reflect.DeepEqual(calls, want) {
		t.Fatalf("another reason %q, want %q (no transition)", calls, want)
	}
}
