package dra

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/logtest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/draapi"
)

func taintAt(key, value string, at time.Time) draslice.Taint {
	return draslice.Taint{Key: testDriver + "/" + key, Value: value, Effect: draslice.EffectNoSchedule, TimeAdded: &at}
}

// A GPU kept unhealthy across a restart (the XID restored from the state
// file) keeps the timeAdded its taint was published with, so the restart
// publishes the slice the previous process left and shows operators when
// the XID came; another condition, or none seeded, is stamped now.
func TestSeededTaintsKeepTheirTime(t *testing.T) {
	now := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	before := now.Add(-3 * time.Hour)
	// Two sources: the GPUs wait for a NIC pool before the first publication.
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 2, Now: func() time.Time { return now }})
	// The health watcher's first poll restores the XIDs before the GPUs
	// are published.
	d.SetHealth("GPU-a", false, "xid=79")
	d.SetHealth("GPU-b", false, "xid=48")
	d.SetHealth("GPU-c", false, "xid=79")
	d.SeedTaints(map[string][]draslice.Taint{
		"gpu-0": {taintAt("xid", "79", before)},
		"gpu-1": {taintAt("xid", "79", before)}, // it was another XID then
	})
	check := func(when string, devs []resourceapi.Device) {
		t.Helper()
		for name, want := range map[string]time.Time{"gpu-0": before, "gpu-1": now, "gpu-2": now} {
			ts := byName(devs)[name].Taints
			if len(ts) != 1 || ts[0].TimeAdded == nil || !ts[0].TimeAdded.Time.Equal(want) {
				t.Errorf("%s: %s taints %+v, want timeAdded %v", when, name, ts, want)
			}
		}
	}
	d.SetGPUs(context.Background(), testGPUs())
	if pub.count() != 0 {
		t.Fatal("published before every source reported")
	}
	var devs []resourceapi.Device
	for _, s := range d.Resources().Pools[testNode].Slices {
		devs = append(devs, s.Devices...)
	}
	check("Resources", devs)
	d.SetNICPool(context.Background(), draslice.NICPool{Name: "example.com/rdma"}, nil, true)
	if pub.count() != 1 {
		t.Fatalf("%d publications once every source reported, want 1", pub.count())
	}
	check("first publication", pub.last(t))

	// The seeds are spent: later seeds do nothing, and the kept time
	// stays while the condition lasts, another joining.
	d.SeedTaints(map[string][]draslice.Taint{"gpu-2": {taintAt("xid", "79", before)}})
	now = now.Add(time.Minute)
	d.SetHealth("GPU-a", false, "xid=79, gpu-lost")
	pub.settle()
	ts := byName(pub.last(t))["gpu-0"].Taints
	if len(ts) != 2 || !ts[0].TimeAdded.Time.Equal(before) || !ts[1].TimeAdded.Time.Equal(now) {
		t.Errorf("after a condition joined: %+v", ts)
	}
	check2 := byName(pub.last(t))["gpu-2"].Taints
	if len(check2) != 1 || !check2[0].TimeAdded.Time.Equal(now.Add(-time.Minute)) {
		t.Errorf("a seed after the first publication was used: %+v", check2)
	}
	// Recovered and failed again: a new condition, stamped now.
	d.SetHealth("GPU-a", true, "")
	now = now.Add(time.Minute)
	d.SetHealth("GPU-a", false, "xid=79")
	pub.settle()
	if ts := byName(pub.last(t))["gpu-0"].Taints; len(ts) != 1 || !ts[0].TimeAdded.Time.Equal(now) {
		t.Errorf("after recovering and failing again: %+v", ts)
	}
}

// Without seeds (a first start, or a read that failed) taints are
// stamped when first seen, as before.
func TestNoSeedsStampNow(t *testing.T) {
	now := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	d, pub := newTestDriver(t, t.TempDir(), Options{Sources: 1, Now: func() time.Time { return now }})
	d.SetHealth("GPU-a", false, "xid=79")
	d.SeedTaints(map[string][]draslice.Taint{})
	d.SetGPUs(context.Background(), testGPUs())
	if ts := byName(pub.last(t))["gpu-0"].Taints; len(ts) != 1 || !ts[0].TimeAdded.Time.Equal(now) {
		t.Errorf("taints %+v, want timeAdded %v", ts, now)
	}
}

// sliceServer answers the LIST of ResourceSlices with body (or status
// when not 200) and records each request.
type sliceServer struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (s *sliceServer) start(t *testing.T, status int, body string) *draapi.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, r)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	kc, err := kubeapi.New(kubeapi.Config{Server: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return draapi.New(kc, 1e6, 1e6, testFieldManager)
}

func (s *sliceServer) requests() []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

const twoSlices = `{"kind":"ResourceSliceList","apiVersion":"resource.k8s.io/v1","metadata":{},"items":[
{"metadata":{"name":"node-a-gpu-device-plugin.github.io-1"},"spec":{"driver":"gpu-device-plugin.github.io","nodeName":"node-a","pool":{"name":"node-a","generation":1,"resourceSliceCount":1},
 "devices":[{"name":"gpu-0","taints":[{"key":"gpu-device-plugin.github.io/xid","value":"79","effect":"NoSchedule","timeAdded":"2026-11-24T07:00:00Z"},{"key":"gpu-device-plugin.github.io/gpu-lost","effect":"NoSchedule"}]},{"name":"gpu-1"}]}},
{"metadata":{"name":"other-pool"},"spec":{"driver":"gpu-device-plugin.github.io","nodeName":"node-a","pool":{"name":"elsewhere","generation":1,"resourceSliceCount":1},
 "devices":[{"name":"gpu-1","taints":[{"key":"gpu-device-plugin.github.io/xid","value":"48","effect":"NoSchedule","timeAdded":"2026-11-24T07:00:00Z"}]}]}}]}`

// The read at start is one LIST narrowed to this driver's slices on this
// node by field selector, never the cluster's, and brings each device's
// timed taints from this node's pool.
func TestPublishedTaintsIsOneNarrowedList(t *testing.T) {
	var s sliceServer
	client := s.start(t, http.StatusOK, twoSlices)
	d, _ := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	var logs logtest.Buffer
	seedTaints(context.Background(), client, d, slog.New(slog.NewTextHandler(&logs, nil)))
	reqs := s.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	r := reqs[0]
	q, _ := url.ParseQuery(r.URL.RawQuery)
	if r.Method != http.MethodGet || r.URL.Path != "/apis/resource.k8s.io/v1/resourceslices" || q.Get("watch") != "" ||
		q.Get("fieldSelector") != "spec.driver="+testDriver+",spec.nodeName="+testNode || q.Get("resourceVersion") != "0" {
		t.Errorf("request %s %s, want one LIST of resourceslices with fieldSelector spec.driver=%s,spec.nodeName=%s from the cache", r.Method, r.URL, testDriver, testNode)
	}
	d.mu.Lock()
	seeds := d.seeds
	d.mu.Unlock()
	want := map[string][]draslice.Taint{"gpu-0": {taintAt("xid", "79", time.Date(2026, 11, 24, 7, 0, 0, 0, time.UTC))}}
	if len(seeds) != len(want) || len(seeds["gpu-0"]) != 1 || seeds["gpu-0"][0].Key != want["gpu-0"][0].Key ||
		seeds["gpu-0"][0].Value != "79" || !seeds["gpu-0"][0].TimeAdded.Equal(*want["gpu-0"][0].TimeAdded) {
		t.Errorf("seeds %+v, want %+v", seeds, want)
	}
	if logs.String() != "" {
		t.Errorf("logged %q", logs.String())
	}
}

// A read that fails (RBAC of an older chart, no API server) is said once,
// at info, and leaves the driver as without seeds.
func TestPublishedTaintsReadFails(t *testing.T) {
	var s sliceServer
	client := s.start(t, http.StatusForbidden, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`)
	d, _ := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	var logs logtest.Buffer
	seedTaints(context.Background(), client, d, slog.New(slog.NewTextHandler(&logs, nil)))
	if n := len(s.requests()); n != 1 {
		t.Errorf("%d requests, want 1 (no retry)", n)
	}
	out := logs.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "level=INFO") || !strings.Contains(out, "ResourceSlices") {
		t.Errorf("log %q, want one info line", out)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seeds != nil {
		t.Errorf("seeds %+v after a failed read", d.seeds)
	}
}
