//go:build gfdcompare

package gfdcompare

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/nodelabels"
)

// recorder is an API server of one pod, owned by a DaemonSet, and no
// NodeFeature: it answers a NodeFeature read 404 and records each
// NodeFeature written.
type recorder struct {
	mu      sync.Mutex
	written []map[string]any
}

const (
	testNamespace = "gpu-system"
	testPod       = "gpu-device-plugin-x7k2p"
	testNode      = "gb200-n1"
)

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	nf := "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/" + testNamespace + "/nodefeatures"
	switch {
	case req.Method == http.MethodGet && req.URL.Path == "/api/v1/namespaces/"+testNamespace+"/pods/"+testPod:
		io.WriteString(w, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"`+testPod+`","namespace":"`+testNamespace+`","uid":"5f0c7a52-pod",`+
			`"ownerReferences":[{"apiVersion":"apps/v1","kind":"DaemonSet","name":"gpu-device-plugin","uid":"9e1d3b44-ds","controller":true,"blockOwnerDeletion":true}]}}`)
	case req.Method == http.MethodGet && req.URL.Path == nf+"/nvidia-features-for-"+testNode:
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"NotFound","code":404}`)
	case (req.Method == http.MethodPost && req.URL.Path == nf) || (req.Method == http.MethodPut && req.URL.Path == nf+"/nvidia-features-for-"+testNode):
		b, _ := io.ReadAll(req.Body)
		var o map[string]any
		if err := json.Unmarshal(b, &o); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.written = append(r.written, o)
		r.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		w.Write(b)
	default:
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"NotFound","code":404}`)
	}
}

func (r *recorder) take(t *testing.T) map[string]any {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.written) != 1 {
		t.Fatalf("%d NodeFeatures written, want 1", len(r.written))
	}
	o := r.written[0]
	r.written = nil
	return o
}

// TestNodeFeatureMatchesGFD: GFD with its NodeFeature API output and the
// plugin's nodeLabels: nodefeature writer, each against a recording API
// server, on the same mock node, write the same object: name, namespace,
// the node-name label, owner references (the pod's DaemonSet as
// controller, then the pod), features and the labels.
func TestNodeFeatureMatchesGFD(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: GFD runs in a private mount namespace with the mock node's sysfs over /sys")
	}
	gfd := buildGFD(t)
	work := t.TempDir()
	plugin, err := harness.BuildPlugin(filepath.Join(work, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	lib, err := mocknvml.Build(filepath.Join(work, "lib"))
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	node := writeNode(t, "gb200-tray")
	kubeconfig := filepath.Join(node, "kubeconfig")
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: " + srv.URL + "\nusers:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}

	args := []string{"--oneshot", "--no-timestamp", "--use-node-feature-api=true", "--kubeconfig", kubeconfig,
		"--node-name", testNode, "--namespace", testNamespace, "--pod-name", testPod,
		"--machine-type-file", "/sys/class/dmi/id/product_name", "--fail-on-init-error"}
	script := `mount --bind "$1" /sys && shift && exec "$@"`
	cmd := exec.CommandContext(ctx(t), "unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", script, "sh",
		filepath.Join(node, "sys"), gfd}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LD_LIBRARY_PATH=" + filepath.Dir(lib),
		"MOCK_NVML_PROFILE=" + filepath.Join(node, "node.profile")}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gpu-feature-discovery: %v\n%s", err, b)
	}
	theirs := rec.take(t)

	labels := runPlugin(t, plugin, lib, node, tc{name: "gb200-tray", profile: "gb200-tray"}, "")
	client, err := kubeapi.New(kubeapi.Config{Server: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	w := &nodelabels.FeatureWriter{API: client, Namespace: testNamespace, Node: testNode, Pod: testPod}
	if wrote, err := w.Sync(context.Background(), labels); err != nil || !wrote {
		t.Fatalf("the plugin's NodeFeature: %v, %v", wrote, err)
	}
	ours := rec.take(t)

	for _, path := range [][]string{
		// The namespace is the URL's, which the recorder checks (GFD's
		// body leaves it out; ours repeats it).
		{"apiVersion"}, {"kind"}, {"metadata", "name"}, {"metadata", "labels"},
		{"metadata", "ownerReferences"}, {"spec", "features"}, {"spec", "labels"},
	} {
		a, b := at(theirs, path), at(ours, path)
		if a == nil || !reflect.DeepEqual(a, b) {
			t.Errorf("%v: GFD %v, ours %v", path, a, b)
		}
	}
	if l, _ := at(theirs, []string{"spec", "labels"}).(map[string]any); l["nvidia.com/gpu.clique"] == nil {
		t.Errorf("GFD's object has no gpu.clique: %v", l)
	}
	t.Logf("GFD %s and the plugin wrote the same NodeFeature %v/%v", gfdVersion(), at(ours, []string{"metadata", "namespace"}), at(ours, []string{"metadata", "name"}))
}

func at(o map[string]any, path []string) any {
	var v any = o
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}
