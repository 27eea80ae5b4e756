package scale

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestAuditTail reads what kube-apiserver writes: a watch counts when it
// starts, anything else when it completes, with the server's latency;
// other users and a line still being written are left out.
func TestAuditTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	lines := `{"stage":"ResponseComplete","verb":"create","user":{"username":"fleet"},"objectRef":{"resource":"events"},"responseStatus":{"code":201},"requestReceivedTimestamp":"2026-11-27T09:00:00.000000Z","stageTimestamp":"2026-11-27T09:00:00.004000Z"}
{"stage":"ResponseStarted","verb":"watch","requestURI":"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3Dd%2Cspec.nodeName%3Dn1\u0026watch=true","user":{"username":"fleet"},"objectRef":{"resource":"resourceslices"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-27T09:00:01.000000Z","stageTimestamp":"2026-11-27T09:00:01.001000Z"}
{"stage":"ResponseComplete","verb":"watch","user":{"username":"fleet"},"objectRef":{"resource":"resourceslices"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-27T09:00:01.000000Z","stageTimestamp":"2026-11-27T09:30:01.000000Z"}
{"stage":"ResponseComplete","verb":"patch","user":{"username":"fleet"},"objectRef":{"resource":"nodes","subresource":"status"},"responseStatus":{"code":429},"requestReceivedTimestamp":"2026-11-27T09:00:02.000000Z","stageTimestamp":"2026-11-27T09:00:02.010000Z"}
{"stage":"ResponseComplete","verb":"list","requestURI":"/api/v1/pods","user":{"username":"fleet"},"objectRef":{"resource":"pods"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-27T09:00:02.500000Z","stageTimestamp":"2026-11-27T09:00:02.501000Z"}
{"stage":"ResponseComplete","verb":"get","user":{"username":"someone-else"},"objectRef":{"resource":"nodes"},"requestReceivedTimestamp":"2026-11-27T09:00:03.000000Z","stageTimestamp":"2026-11-27T09:00:03.001000Z"}
{"stage":"ResponseComplete","verb":"update","user":{"username":"fleet"},"objectRef":{"resource":"resourceslices"}`
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	a := &auditTail{path: path, user: "fleet"}
	reqs, err := a.read()
	if err != nil {
		t.Fatal(err)
	}
	p := phase{reqs: reqs}
	if got := p.summary(); got != "create events ×1, patch nodes/status ×1, list pods ×1, watch resourceslices ×1" {
		t.Errorf("requests: %s", got)
	}
	if got := p.writes(); got != 2 {
		t.Errorf("writes: %d, want 2", got)
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
	// The partial last line is read once it is whole.
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`,"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-27T09:00:04.000000Z","stageTimestamp":"2026-11-27T09:00:04.002000Z"}` + "\n")
	f.Close()
	reqs, err = a.read()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 1 || reqs[0].verb != "update" || reqs[0].latency != 2*time.Millisecond {
		t.Errorf("after the line was finished: %+v", reqs)
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
