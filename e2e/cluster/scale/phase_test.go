package scale

import (
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/cluster/auditlog"
)

// TestPhase: a phase's writes, non-2xx codes, latencies (watches left
// out) and the lists and watches not narrowed to one node.
func TestPhase(t *testing.T) {
	p := phase{reqs: []auditlog.Request{
		{Verb: "create", Resource: "events", Code: 201, Latency: 4 * time.Millisecond},
		{Verb: "watch", Resource: "resourceslices", URI: "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3Dd%2Cspec.nodeName%3Dn1&watch=true", Code: 200},
		{Verb: "patch", Resource: "nodes/status", Code: 429, Latency: 10 * time.Millisecond},
		{Verb: "list", Resource: "pods", URI: "/api/v1/pods", Code: 200, Latency: time.Millisecond},
	}}
	if got := p.writes(); got != 2 {
		t.Errorf("writes: %d, want 2", got)
	}
	if got := p.count("watch", "resourceslices"); got != 1 {
		t.Errorf("watches of resourceslices: %d, want 1", got)
	}
	if got := p.codes(); got != "1×429" {
		t.Errorf("codes: %s", got)
	}
	if l := p.latencies(); len(l) != 3 || l[0] != time.Millisecond || l[2] != 10*time.Millisecond {
		t.Errorf("latencies: %v, want [1ms 4ms 10ms]", l)
	}
	if wide := p.clusterWide(); len(wide) != 1 || wide[0] != "list /api/v1/pods" {
		t.Errorf("cluster-wide reads: %q, want the list of all pods only", wide)
	}
	if got := p.perNode(2); got != "create events 0.50, patch nodes/status 0.50, list pods 0.50, watch resourceslices 0.50" {
		t.Errorf("per node: %s", got)
	}
}

func TestQuantile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for q, want := range map[float64]time.Duration{0.5: 50 * time.Millisecond, 0.99: 99 * time.Millisecond, 1: 100 * time.Millisecond} {
		if got := quantile(d, q); got != want {
			t.Errorf("quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if quantile(nil, .5) != 0 {
		t.Error("quantile of none is not 0")
	}
}
