package auditlog

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestTail reads what kube-apiserver writes: a watch counts when it
// starts, anything else when it completes, with the server's latency;
// other users, requests of no object and a line still being written are
// left out.
func TestTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	lines := `{"stage":"ResponseComplete","verb":"create","user":{"username":"fleet"},"objectRef":{"resource":"events"},"responseStatus":{"code":201},"requestReceivedTimestamp":"2026-11-27T09:00:00.000000Z","stageTimestamp":"2026-11-27T09:00:00.004000Z"}
{"stage":"ResponseStarted","verb":"watch","requestURI":"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3Dd%2Cspec.nodeName%3Dn1\u0026watch=true","user":{"username":"fleet"},"objectRef":{"resource":"resourceslices"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-27T09:00:01.000000Z","stageTimestamp":"2026-11-27T09:00:01.001000Z"}
{"stage":"ResponseComplete","verb":"watch","user":{"username":"fleet"},"objectRef":{"resource":"resourceslices"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-27T09:00:01.000000Z","stageTimestamp":"2026-11-27T09:30:01.000000Z"}
{"stage":"RequestReceived","verb":"get","user":{"username":"fleet"},"objectRef":{"resource":"nodes"},"requestReceivedTimestamp":"2026-11-27T09:00:01.500000Z","stageTimestamp":"2026-11-27T09:00:01.500000Z"}
{"stage":"ResponseComplete","verb":"get","requestURI":"/version","user":{"username":"fleet"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-27T09:00:01.600000Z","stageTimestamp":"2026-11-27T09:00:01.601000Z"}
{"stage":"ResponseComplete","verb":"patch","user":{"username":"fleet"},"objectRef":{"resource":"nodes","subresource":"status"},"responseStatus":{"code":429},"requestReceivedTimestamp":"2026-11-27T09:00:02.000000Z","stageTimestamp":"2026-11-27T09:00:02.010000Z"}
{"stage":"ResponseComplete","verb":"list","requestURI":"/api/v1/pods","user":{"username":"fleet"},"objectRef":{"resource":"pods"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-27T09:00:02.500000Z","stageTimestamp":"2026-11-27T09:00:02.501000Z"}
{"stage":"ResponseComplete","verb":"get","user":{"username":"someone-else"},"objectRef":{"resource":"nodes"},"requestReceivedTimestamp":"2026-11-27T09:00:03.000000Z","stageTimestamp":"2026-11-27T09:00:03.001000Z"}
not json
{"stage":"ResponseComplete","verb":"update","user":{"username":"fleet"},"objectRef":{"resource":"resourceslices"}`
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	a := &Tail{Path: path, User: "fleet"}
	reqs, err := a.Read()
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		x, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	want := []Request{
		{Verb: "create", Resource: "events", Code: 201, Latency: 4 * time.Millisecond, At: at("2026-11-27T09:00:00Z")},
		{Verb: "watch", Resource: "resourceslices", URI: "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3Dd%2Cspec.nodeName%3Dn1&watch=true", Code: 200, At: at("2026-11-27T09:00:01Z")},
		{Verb: "patch", Resource: "nodes/status", Code: 429, Latency: 10 * time.Millisecond, At: at("2026-11-27T09:00:02Z")},
		{Verb: "list", Resource: "pods", URI: "/api/v1/pods", Code: 200, Latency: time.Millisecond, At: at("2026-11-27T09:00:02.5Z")},
	}
	if len(reqs) != len(want) {
		t.Fatalf("read %d requests, want %d: %+v", len(reqs), len(want), reqs)
	}
	for i := range want {
		if g, w := reqs[i], want[i]; g.Verb != w.Verb || g.Resource != w.Resource || g.URI != w.URI || g.Code != w.Code || g.Latency != w.Latency || !g.At.Equal(w.At) {
			t.Errorf("request %d: %+v, want %+v", i, g, w)
		}
	}
	if got := Summary(reqs); got != "4 requests: create events ×1, patch nodes/status ×1, list pods ×1, watch resourceslices ×1" {
		t.Errorf("summary: %s", got)
	}
	if c := Count(reqs); len(c) != 4 || c["patch nodes/status"] != 1 || c["watch resourceslices"] != 1 {
		t.Errorf("count: %v", c)
	}

	// Nothing new: nothing read.
	if reqs, err := a.Read(); err != nil || len(reqs) != 0 {
		t.Errorf("read again: %+v, %v; want nothing", reqs, err)
	}
	// The partial last line is read once it is whole.
	appendTo(t, path, `,"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-27T09:00:04.000000Z","stageTimestamp":"2026-11-27T09:00:04.002000Z"}`+"\n")
	reqs, err = a.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 1 || reqs[0].Verb != "update" || reqs[0].Latency != 2*time.Millisecond {
		t.Errorf("after the line was finished: %+v", reqs)
	}
}

// TestMark: what was logged before Mark is not read.
func TestMark(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	line := func(verb string) string {
		return `{"stage":"ResponseComplete","verb":"` + verb + `","user":{"username":"fleet"},"objectRef":{"resource":"nodes"},"responseStatus":{"code":200}}` + "\n"
	}
	if err := os.WriteFile(path, []byte(line("get")), 0o644); err != nil {
		t.Fatal(err)
	}
	a := &Tail{Path: path, User: "fleet"}
	if err := a.Mark(); err != nil {
		t.Fatal(err)
	}
	appendTo(t, path, line("update"))
	reqs, err := a.Read()
	if err != nil {
		t.Fatal(err)
	}
	if got := Summary(reqs); got != "1 request: update nodes ×1" {
		t.Errorf("after Mark: %s", got)
	}
	if err := (&Tail{Path: filepath.Join(t.TempDir(), "none")}).Mark(); err == nil {
		t.Error("Mark of a missing log: no error")
	}
}

func TestWrite(t *testing.T) {
	for verb, want := range map[string]bool{"create": true, "update": true, "patch": true, "delete": true, "deletecollection": true, "get": false, "list": false, "watch": false} {
		if got := (Request{Verb: verb}).Write(); got != want {
			t.Errorf("%s: Write() = %v, want %v", verb, got, want)
		}
	}
	if got := Summary(nil); got != "0 requests" {
		t.Errorf("summary of none: %q", got)
	}
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}
