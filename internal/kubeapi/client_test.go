package kubeapi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// request is what the fake API server saw.
type request struct {
	Method, Path, ContentType, Auth, UserAgent string
	Body                                       map[string]any
	ClientCN                                   string
}

// apiServer is an httptest TLS server that records requests and answers
// each with the next canned response (200 {} when none is left).
type apiServer struct {
	*httptest.Server
	mu      sync.Mutex
	reqs    []request
	answers []answer
}

type answer struct {
	code   int
	body   string
	header http.Header
}

func newAPIServer(t *testing.T, clientCAs *x509.CertPool) *apiServer {
	t.Helper()
	a := &apiServer{}
	a.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rq := request{Method: r.Method, Path: r.URL.Path, ContentType: r.Header.Get("Content-Type"), Auth: r.Header.Get("Authorization"), UserAgent: r.Header.Get("User-Agent")}
		if len(b) > 0 {
			if err := json.Unmarshal(b, &rq.Body); err != nil {
				t.Errorf("request body is not JSON: %v: %s", err, b)
			}
		}
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			rq.ClientCN = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		a.mu.Lock()
		a.reqs = append(a.reqs, rq)
		ans := answer{code: 200, body: "{}"}
		if len(a.answers) > 0 {
			ans, a.answers = a.answers[0], a.answers[1:]
		}
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		for k, v := range ans.header {
			w.Header()[k] = v
		}
		w.WriteHeader(ans.code)
		io.WriteString(w, ans.body)
	}))
	if clientCAs != nil {
		a.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs}
	}
	a.StartTLS()
	t.Cleanup(a.Close)
	return a
}

func (a *apiServer) answer(code int, body string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answers = append(a.answers, answer{code: code, body: body})
}

func (a *apiServer) answerWith(code int, body string, header http.Header) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answers = append(a.answers, answer{code, body, header})
}

func (a *apiServer) requests() []request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]request(nil), a.reqs...)
}

func (a *apiServer) last(t *testing.T) request {
	t.Helper()
	r := a.requests()
	if len(r) == 0 {
		t.Fatal("no request reached the server")
	}
	return r[len(r)-1]
}

func (a *apiServer) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Certificate().Raw})
}

// clientCA makes a CA and a client certificate it signed, as PEM.
func clientCA(t *testing.T, cn string) (pool *x509.CertPool, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(caCert)
	return pool, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func kubeconfigFile(t *testing.T, dir, cluster, user string) string {
	t.Helper()
	body := "apiVersion: v1\nkind: Config\ncurrent-context: c\n" +
		"preferences: {}\n" +
		"contexts:\n- name: other\n  context: {cluster: nope, user: nope}\n- name: c\n  context: {cluster: k, user: u, namespace: kube-system}\n" +
		"clusters:\n- name: k\n  cluster:\n" + cluster +
		"users:\n- name: u\n  user:\n" + user
	p := filepath.Join(dir, "kubeconfig")
	write(t, p, []byte(body))
	return p
}

func load(t *testing.T, path string) Config {
	t.Helper()
	c, err := LoadKubeconfig(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustClient(t *testing.T, c Config) *Client {
	t.Helper()
	c.UserAgent = "test-agent"
	cl, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func TestKubeconfigTokenAndCAData(t *testing.T) {
	srv := newAPIServer(t, nil)
	dir := t.TempDir()
	p := kubeconfigFile(t, dir,
		"    server: "+srv.URL+"\n    certificate-authority-data: "+b64(srv.caPEM())+"\n",
		"    token: s3cret\n")
	cl := mustClient(t, load(t, p))
	if _, err := cl.GetNode(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	r := srv.last(t)
	if r.Method != "GET" || r.Path != "/api/v1/nodes/n1" || r.Auth != "Bearer s3cret" || r.UserAgent != "test-agent" {
		t.Fatalf("request = %+v", r)
	}
}

// File paths in a kubeconfig are relative to its directory; the token
// file is re-read when it changes.
func TestKubeconfigRelativeFilesAndTokenRotation(t *testing.T) {
	srv := newAPIServer(t, nil)
	dir := t.TempDir()
	write(t, filepath.Join(dir, "ca.crt"), srv.caPEM())
	write(t, filepath.Join(dir, "token"), []byte("one\n"))
	p := kubeconfigFile(t, dir, "    server: "+srv.URL+"\n    certificate-authority: ca.crt\n", "    tokenFile: token\n")
	cl := mustClient(t, load(t, p))
	ctx := context.Background()
	if _, err := cl.GetPod(ctx, "ns", "p"); err != nil {
		t.Fatal(err)
	}
	if a := srv.last(t).Auth; a != "Bearer one" {
		t.Fatalf("first token: %q", a)
	}
	write(t, filepath.Join(dir, "token"), []byte("rotated\n"))
	// A rotation within the same second as the first write must be seen.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(filepath.Join(dir, "token"), later, later); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.GetPod(ctx, "ns", "p"); err != nil {
		t.Fatal(err)
	}
	if a := srv.last(t).Auth; a != "Bearer rotated" {
		t.Fatalf("after rotation: %q", a)
	}
}

func TestKubeconfigClientCertificate(t *testing.T) {
	pool, certPEM, keyPEM := clientCA(t, "system:node:n1")
	srv := newAPIServer(t, pool)
	ca := "    server: " + srv.URL + "\n    certificate-authority-data: " + b64(srv.caPEM()) + "\n"
	t.Run("data", func(t *testing.T) {
		dir := t.TempDir()
		p := kubeconfigFile(t, dir, ca, "    client-certificate-data: "+b64(certPEM)+"\n    client-key-data: "+b64(keyPEM)+"\n")
		cl := mustClient(t, load(t, p))
		if _, err := cl.GetNode(context.Background(), "n1"); err != nil {
			t.Fatal(err)
		}
		if r := srv.last(t); r.ClientCN != "system:node:n1" || r.Auth != "" {
			t.Fatalf("request = %+v", r)
		}
	})
	t.Run("files", func(t *testing.T) {
		dir := t.TempDir()
		// One file holding both, as the kubelet's rotated
		// kubelet-client-current.pem does.
		write(t, filepath.Join(dir, "client.pem"), append(append([]byte{}, certPEM...), keyPEM...))
		p := kubeconfigFile(t, dir, ca, "    client-certificate: client.pem\n    client-key: client.pem\n")
		cl := mustClient(t, load(t, p))
		if _, err := cl.GetNode(context.Background(), "n1"); err != nil {
			t.Fatal(err)
		}
		if r := srv.last(t); r.ClientCN != "system:node:n1" {
			t.Fatalf("request = %+v", r)
		}
	})
	t.Run("no certificate", func(t *testing.T) {
		dir := t.TempDir()
		p := kubeconfigFile(t, dir, ca, "    token: x\n")
		cl := mustClient(t, load(t, p))
		if _, err := cl.GetNode(context.Background(), "n1"); err == nil {
			t.Fatal("a server requiring a client certificate answered without one")
		}
	})
}

func TestKubeconfigErrors(t *testing.T) {
	tests := []struct {
		name, cluster, user, want string
	}{
		{"exec plugin", "    server: https://x\n", "    exec: {command: aws}\n", "credential plugins"},
		{"no server", "    insecure-skip-tls-verify: true\n", "    token: x\n", "no server"},
		{"missing CA file", "    server: https://x\n    certificate-authority: nope.crt\n", "    token: x\n", "nope.crt"},
		{"proxy", "    server: https://x\n    proxy-url: http://proxy\n", "    token: x\n", "proxy-url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadKubeconfig(kubeconfigFile(t, t.TempDir(), tt.cluster, tt.user))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
		})
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "kc")
	write(t, p, []byte("current-context: gone\ncontexts: []\n"))
	if _, err := LoadKubeconfig(p); err == nil || !strings.Contains(err.Error(), `"gone"`) {
		t.Fatalf("unknown context: %v", err)
	}
	if _, err := LoadKubeconfig(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing file accepted")
	}
}

func TestInCluster(t *testing.T) {
	srv := newAPIServer(t, nil)
	host, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "ca.crt"), srv.caPEM())
	write(t, filepath.Join(dir, "token"), []byte("sa-token-1"))
	env := map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
	cfg, err := InClusterFrom(func(k string) string { return env[k] }, dir)
	if err != nil {
		t.Fatal(err)
	}
	cl := mustClient(t, cfg)
	ctx := context.Background()
	if err := cl.CreateEvent(ctx, Event{InvolvedObject: ObjectReference{Kind: "Node", Name: "n1"}}); err != nil {
		t.Fatal(err)
	}
	if r := srv.last(t); r.Auth != "Bearer sa-token-1" || r.Path != "/api/v1/namespaces/default/events" {
		t.Fatalf("request = %+v", r)
	}
	write(t, filepath.Join(dir, "token"), []byte("sa-token-2-longer"))
	if err := cl.CreateEvent(ctx, Event{InvolvedObject: ObjectReference{Kind: "Node", Name: "n1"}}); err != nil {
		t.Fatal(err)
	}
	if r := srv.last(t); r.Auth != "Bearer sa-token-2-longer" {
		t.Fatalf("rotated token not used: %+v", r)
	}

	if _, err := InClusterFrom(func(string) string { return "" }, dir); err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST") {
		t.Fatalf("outside a pod: %v", err)
	}
	if _, err := InClusterFrom(func(k string) string { return env[k] }, t.TempDir()); err == nil || !strings.Contains(err.Error(), "token") {
		t.Fatalf("no token: %v", err)
	}
}

func testClient(t *testing.T) (*Client, *apiServer) {
	t.Helper()
	srv := newAPIServer(t, nil)
	cl := mustClient(t, Config{Server: srv.URL, CAData: srv.caPEM(), Token: "t"})
	return cl, srv
}

func TestCreateEventRequest(t *testing.T) {
	cl, srv := testClient(t)
	ts := time.Date(2026, 3, 4, 5, 6, 7, 890, time.FixedZone("x", 3600))
	e := Event{
		Metadata:           ObjectMeta{Name: "trainer-0.18a"},
		InvolvedObject:     ObjectReference{Kind: "Pod", Namespace: "ml", Name: "trainer-0", UID: "u-1", APIVersion: "v1"},
		Reason:             "GPUUnhealthy",
		Message:            "GPU-1 (index 3): xid=79: fallen off the bus",
		Type:               EventWarning,
		Source:             EventSource{Component: "gpu-device-plugin", Host: "n1"},
		FirstTimestamp:     NewTime(ts),
		LastTimestamp:      NewTime(ts),
		Count:              1,
		ReportingComponent: "gpu-device-plugin",
		ReportingInstance:  "n1",
	}
	if err := cl.CreateEvent(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	r := srv.last(t)
	if r.Method != "POST" || r.Path != "/api/v1/namespaces/ml/events" || r.ContentType != "application/json" || r.Auth != "Bearer t" {
		t.Fatalf("request = %+v", r)
	}
	want := `{"count":1,"firstTimestamp":"2026-03-04T04:06:07Z","involvedObject":{"apiVersion":"v1","kind":"Pod","name":"trainer-0","namespace":"ml","uid":"u-1"},"lastTimestamp":"2026-03-04T04:06:07Z","message":"GPU-1 (index 3): xid=79: fallen off the bus","metadata":{"name":"trainer-0.18a","namespace":"ml"},"reason":"GPUUnhealthy","reportingComponent":"gpu-device-plugin","reportingInstance":"n1","source":{"component":"gpu-device-plugin","host":"n1"},"type":"Warning"}`
	if got, _ := json.Marshal(r.Body); string(got) != want {
		t.Fatalf("body\n got %s\nwant %s", got, want)
	}
}

func TestPatchRequests(t *testing.T) {
	cl, srv := testClient(t)
	ctx := context.Background()
	ts := NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	cond := NodeCondition{Type: "GPUHealthy", Status: ConditionFalse, Reason: "GPUUnhealthy", Message: "m", LastHeartbeatTime: ts, LastTransitionTime: ts}
	if err := cl.PatchNodeCondition(ctx, "n1", cond); err != nil {
		t.Fatal(err)
	}
	r := srv.last(t)
	if r.Method != "PATCH" || r.Path != "/api/v1/nodes/n1/status" || r.ContentType != "application/strategic-merge-patch+json" {
		t.Fatalf("request = %+v", r)
	}
	want := `{"status":{"conditions":[{"lastHeartbeatTime":"2026-01-02T03:04:05Z","lastTransitionTime":"2026-01-02T03:04:05Z","message":"m","reason":"GPUUnhealthy","status":"False","type":"GPUHealthy"}]}}`
	if got, _ := json.Marshal(r.Body); string(got) != want {
		t.Fatalf("body\n got %s\nwant %s", got, want)
	}
	if err := cl.PatchEvent(ctx, "default", "n1.1f", 7, ts); err != nil {
		t.Fatal(err)
	}
	r = srv.last(t)
	if r.Method != "PATCH" || r.Path != "/api/v1/namespaces/default/events/n1.1f" || r.ContentType != "application/strategic-merge-patch+json" {
		t.Fatalf("request = %+v", r)
	}
	if got, _ := json.Marshal(r.Body); string(got) != `{"count":7,"lastTimestamp":"2026-01-02T03:04:05Z"}` {
		t.Fatalf("body %s", got)
	}
}

func TestGetDecodes(t *testing.T) {
	cl, srv := testClient(t)
	ctx := context.Background()
	srv.answer(200, `{"kind":"Pod","metadata":{"name":"p","namespace":"ns","uid":"pod-uid"},"spec":{"nodeName":"n1"}}`)
	p, err := cl.GetPod(ctx, "ns", "p")
	if err != nil || p.Metadata.UID != "pod-uid" {
		t.Fatalf("GetPod = %+v, %v", p, err)
	}
	if r := srv.last(t); r.Path != "/api/v1/namespaces/ns/pods/p" {
		t.Fatalf("path %s", r.Path)
	}
	srv.answer(200, `{"kind":"Node","metadata":{"name":"n1","uid":"node-uid"},"status":{"conditions":[{"type":"Ready","status":"True","lastHeartbeatTime":null,"lastTransitionTime":"2026-01-02T03:04:05Z"}]}}`)
	n, err := cl.GetNode(ctx, "n1")
	if err != nil || n.Metadata.UID != "node-uid" {
		t.Fatalf("GetNode = %+v, %v", n, err)
	}
	c, ok := n.Condition("Ready")
	if !ok || c.Status != "True" || !c.LastTransitionTime.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) || !c.LastHeartbeatTime.IsZero() {
		t.Fatalf("Ready = %+v, %v", c, ok)
	}
}

func TestErrorsNameStatusAndMessage(t *testing.T) {
	cl, srv := testClient(t)
	ctx := context.Background()
	srv.answer(403, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"events is forbidden: User \"system:serviceaccount:x:y\" cannot create resource \"events\"","reason":"Forbidden","code":403}`)
	err := cl.CreateEvent(ctx, Event{InvolvedObject: ObjectReference{Kind: "Node", Name: "n1"}})
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range []string{"POST /api/v1/namespaces/default/events", "403 Forbidden", "cannot create resource"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not mention %q", err, w)
		}
	}
	srv.answer(404, `{"kind":"Status","status":"Failure","message":"pods \"p\" not found","reason":"NotFound","code":404}`)
	if _, err := cl.GetPod(ctx, "ns", "p"); !IsNotFound(err) || IsAlreadyExists(err) {
		t.Fatalf("404: %v", err)
	}
	srv.answer(409, `{"kind":"Status","status":"Failure","message":"exists","reason":"AlreadyExists","code":409}`)
	if err := cl.CreateEvent(ctx, Event{}); !IsAlreadyExists(err) {
		t.Fatalf("409: %v", err)
	}
	srv.answer(502, "<html>bad gateway</html>")
	if _, err := cl.GetNode(ctx, "n1"); err == nil || !strings.Contains(err.Error(), "502 Bad Gateway: <html>bad gateway</html>") || IsNotFound(err) {
		t.Fatalf("502: %v", err)
	}
	// A server certificate the CA does not vouch for.
	other := mustClient(t, Config{Server: srv.URL, Token: "t"})
	if _, err := other.GetNode(ctx, "n1"); err == nil || !strings.Contains(err.Error(), "GET /api/v1/nodes/n1") {
		t.Fatalf("untrusted server: %v", err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, c := range []Config{
		{Server: "ftp://x"},
		{Server: "https://x", CAData: []byte("not pem")},
		{Server: "https://x", CertData: []byte("x"), KeyData: []byte("y")},
		{Server: "https://x", TokenFile: "/nonexistent/token"},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

func TestNodeMetadata(t *testing.T) {
	cl, srv := testClient(t)
	ctx := context.Background()
	srv.answer(200, `{"kind":"Node","metadata":{"name":"n1","labels":{"kubernetes.io/hostname":"n1","nvidia.com/gpu.count":"8"},"annotations":{"gpu-device-plugin.github.io/node-labels":"nvidia.com/gpu.count"}}}`)
	n, err := cl.GetNode(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if n.Metadata.Labels["nvidia.com/gpu.count"] != "8" || n.Metadata.Labels["kubernetes.io/hostname"] != "n1" || n.Metadata.Annotations["gpu-device-plugin.github.io/node-labels"] != "nvidia.com/gpu.count" {
		t.Fatalf("metadata %+v", n.Metadata)
	}

	v := "H100"
	p := MetadataPatch{
		Labels:      map[string]*string{"nvidia.com/gpu.product": &v, "nvidia.com/gpu.count": nil},
		Annotations: map[string]*string{"gpu-device-plugin.github.io/node-labels": nil},
	}
	if err := cl.PatchNodeMetadata(ctx, "n1", p); err != nil {
		t.Fatal(err)
	}
	r := srv.last(t)
	if r.Method != "PATCH" || r.Path != "/api/v1/nodes/n1" || r.ContentType != "application/merge-patch+json" {
		t.Fatalf("request = %+v", r)
	}
	want := `{"metadata":{"annotations":{"gpu-device-plugin.github.io/node-labels":null},"labels":{"nvidia.com/gpu.count":null,"nvidia.com/gpu.product":"H100"}}}`
	if got, _ := json.Marshal(r.Body); string(got) != want {
		t.Fatalf("body\n got %s\nwant %s", got, want)
	}
	// Labels only: no annotations key at all, which a merge patch would
	// otherwise read as "set annotations to null".
	if err := cl.PatchNodeMetadata(ctx, "n1", MetadataPatch{Labels: map[string]*string{"nvidia.com/gpu.product": &v}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := json.Marshal(srv.last(t).Body); string(got) != `{"metadata":{"labels":{"nvidia.com/gpu.product":"H100"}}}` {
		t.Fatalf("body %s", got)
	}
	if (MetadataPatch{}).Empty() != true || p.Empty() {
		t.Error("Empty")
	}
}

// A cordon and its undoing: spec.unschedulable and our annotation in one
// merge patch, with the resourceVersion read as its precondition; the
// annotation alone leaves spec out.
func TestNodeScheduling(t *testing.T) {
	cl, srv := testClient(t)
	ctx := context.Background()
	srv.answer(200, `{"kind":"Node","metadata":{"name":"n1","resourceVersion":"42"},"spec":{"unschedulable":true}}`)
	n, err := cl.GetNode(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if n.Metadata.ResourceVersion != "42" || !n.Spec.Unschedulable {
		t.Fatalf("node %+v", n)
	}
	on, off, why := true, false, "GPU-a: gpu-lost"
	for _, tc := range []struct {
		p    SchedulingPatch
		want string
	}{
		{SchedulingPatch{Unschedulable: &on, Annotations: map[string]*string{"a/b": &why}, ResourceVersion: "42"},
			`{"metadata":{"annotations":{"a/b":"GPU-a: gpu-lost"},"resourceVersion":"42"},"spec":{"unschedulable":true}}`},
		{SchedulingPatch{Unschedulable: &off, Annotations: map[string]*string{"a/b": nil}, ResourceVersion: "43"},
			`{"metadata":{"annotations":{"a/b":null},"resourceVersion":"43"},"spec":{"unschedulable":false}}`},
		{SchedulingPatch{Annotations: map[string]*string{"a/b": nil}}, `{"metadata":{"annotations":{"a/b":null}}}`},
	} {
		if err := cl.PatchNodeScheduling(ctx, "n1", tc.p); err != nil {
			t.Fatal(err)
		}
		r := srv.last(t)
		if r.Method != "PATCH" || r.Path != "/api/v1/nodes/n1" || r.ContentType != "application/merge-patch+json" {
			t.Fatalf("request = %+v", r)
		}
		if got, _ := json.Marshal(r.Body); string(got) != tc.want {
			t.Errorf("body\n got %s\nwant %s", got, tc.want)
		}
	}
}

// Events carry no labels or annotations keys: ObjectMeta's new fields are
// omitted when empty.
func TestEventMetadataUnchanged(t *testing.T) {
	b, err := json.Marshal(ObjectMeta{Name: "n1.1f", Namespace: "default"})
	if err != nil || string(b) != `{"name":"n1.1f","namespace":"default"}` {
		t.Fatalf("%s, %v", b, err)
	}
}

// Every write names the field manager, so the plugin's managedFields entry
// is the one the chart's admission policies expect; a read names none.
func TestFieldManagerOnWrites(t *testing.T) {
	var mu sync.Mutex
	queries := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries[r.Method+" "+r.URL.Path] = r.URL.RawQuery
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	cl, err := New(Config{Server: srv.URL, FieldManager: "gpu-device-plugin"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ts := NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	for _, err := range []error{
		cl.PatchNodeCondition(ctx, "n1", NodeCondition{Type: "GPUHealthy", Status: ConditionTrue, LastHeartbeatTime: ts, LastTransitionTime: ts}),
		cl.PatchNodeMetadata(ctx, "n1", MetadataPatch{}),
		cl.PatchNodeScheduling(ctx, "n2", SchedulingPatch{}),
		cl.CreateEvent(ctx, Event{Metadata: ObjectMeta{Name: "e"}}),
		cl.PatchEvent(ctx, "default", "e", 2, ts),
		func() error { _, err := cl.GetNode(ctx, "n1"); return err }(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for req, want := range map[string]string{
		"PATCH /api/v1/nodes/n1/status":             "fieldManager=gpu-device-plugin",
		"PATCH /api/v1/nodes/n1":                    "fieldManager=gpu-device-plugin",
		"POST /api/v1/namespaces/default/events":    "fieldManager=gpu-device-plugin",
		"PATCH /api/v1/namespaces/default/events/e": "fieldManager=gpu-device-plugin",
		"PATCH /api/v1/nodes/n2":                    "fieldManager=gpu-device-plugin",
		"GET /api/v1/nodes/n1":                      "",
	} {
		if got, ok := queries[req]; !ok || got != want {
			t.Errorf("%s: query %q (sent: %v), want %q", req, got, ok, want)
		}
	}
}

// NodeFeatures: a create and an update carry the whole object in
// NodeFeature's group and version, with features' three maps as {} (as
// NFD's own types write them), and a read keeps the owner references.
func TestNodeFeatureRequests(t *testing.T) {
	cl, srv := testClient(t)
	ctx := context.Background()
	yes := true
	f := NodeFeature{
		Metadata: ObjectMeta{Name: "nvidia-features-for-n1", Namespace: "gpu", Labels: map[string]string{"nfd.node.kubernetes.io/node-name": "n1"},
			OwnerReferences: []OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "ds-uid", Controller: &yes}}},
		Spec: NodeFeatureSpec{Labels: map[string]string{"nvidia.com/gpu.count": "8"}},
	}
	want := `{"apiVersion":"nfd.k8s-sigs.io/v1alpha1","kind":"NodeFeature","metadata":{"labels":{"nfd.node.kubernetes.io/node-name":"n1"},"name":"nvidia-features-for-n1","namespace":"gpu",` +
		`"ownerReferences":[{"apiVersion":"apps/v1","controller":true,"kind":"DaemonSet","name":"ds","uid":"ds-uid"}]},"spec":{"features":{"attributes":{},"flags":{},"instances":{}},"labels":{"nvidia.com/gpu.count":"8"}}}`
	f.Spec.Features = NodeFeatureFeatures{Flags: map[string]json.RawMessage{}, Attributes: map[string]json.RawMessage{}, Instances: map[string]json.RawMessage{}}
	if err := cl.CreateNodeFeature(ctx, f); err != nil {
		t.Fatal(err)
	}
	r := srv.last(t)
	if r.Method != "POST" || r.Path != "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpu/nodefeatures" || r.ContentType != "application/json" {
		t.Fatalf("request = %+v", r)
	}
	if got, _ := json.Marshal(r.Body); string(got) != want {
		t.Fatalf("body\n got %s\nwant %s", got, want)
	}
	if err := cl.UpdateNodeFeature(ctx, f); err != nil {
		t.Fatal(err)
	}
	if r := srv.last(t); r.Method != "PUT" || r.Path != "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpu/nodefeatures/nvidia-features-for-n1" {
		t.Fatalf("request = %+v", r)
	}
	srv.answer(200, `{"apiVersion":"nfd.k8s-sigs.io/v1alpha1","kind":"NodeFeature","metadata":{"name":"x","namespace":"gpu","resourceVersion":"7",`+
		`"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":"p","uid":"pod-uid"}]},"spec":{"features":{"flags":{"f":{"elements":{}}}},"labels":{"a":"b"}}}`)
	got, err := cl.GetNodeFeature(ctx, "gpu", "x")
	if err != nil || got.Metadata.ResourceVersion != "7" || len(got.Metadata.OwnerReferences) != 1 || got.Metadata.OwnerReferences[0].UID != "pod-uid" ||
		got.Spec.Labels["a"] != "b" || string(got.Spec.Features.Flags["f"]) != `{"elements":{}}` {
		t.Fatalf("GetNodeFeature = %+v, %v", got, err)
	}
}
