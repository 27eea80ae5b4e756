package dra

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/draapi"
)

// On a node where neither directory exists yet (the node package, a host
// run), DRA mode makes them rather than failing to bind its sockets.
func TestMakePluginDirs(t *testing.T) {
	root := t.TempDir()
	s := Settings{
		PluginDir:         filepath.Join(root, "var/lib/kubelet/plugins", config.DRADriverName),
		PluginRegistryDir: filepath.Join(root, "var/lib/kubelet/plugins_registry"),
	}
	if err := makePluginDirs(s); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{s.PluginDir, s.PluginRegistryDir} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o750 {
			t.Errorf("%s: %v, %v; want a 0750 directory", d, fi, err)
		}
	}
	if err := makePluginDirs(s); err != nil {
		t.Errorf("second run: %v", err)
	}
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s.PluginDir = filepath.Join(file, "plugin")
	if err := makePluginDirs(s); err == nil || !strings.Contains(err.Error(), "draPluginDir (--dra-plugin-dir)") {
		t.Errorf("err = %v, want one naming draPluginDir", err)
	}
}

// The client's request limit and user agent are ours.
func TestAPIClientSettings(t *testing.T) {
	var mu sync.Mutex
	var agents []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		agents = append(agents, r.UserAgent()+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"ResourceClaim","apiVersion":"resource.k8s.io/v1","metadata":{"name":"c","namespace":"n","uid":"u"}}`)
	}))
	defer srv.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	body := "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n" +
		"clusters:\n- name: k\n  cluster: {server: '" + srv.URL + "'}\nusers:\n- name: u\n  user: {token: t}\n"
	if err := os.WriteFile(kc, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	s := Settings{Kubeconfig: kc, FieldManager: config.FieldManager}
	api, err := apiClient(s, frontEndOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.GetClaim(context.Background(), "n", "c"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(agents) != 1 || agents[0] != "gpu-device-plugin Bearer t" {
		t.Errorf("user agent and credentials %q", agents)
	}
	mu.Unlock()
	s.Kubeconfig = filepath.Join(t.TempDir(), "missing")
	if _, err := apiClient(s, frontEndOptions{}); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Errorf("missing kubeconfig: %v", err)
	}
}

// The rebuild reads a claim with one namespaced GET, the only access the
// chart's RBAC grants on ResourceClaims (get), and never lists them.
func TestAPIClaimsIsOneNamespacedGET(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/train" {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
			return
		}
		fmt.Fprint(w, `{"kind":"ResourceClaim","apiVersion":"resource.k8s.io/v1","metadata":{"name":"train","namespace":"team-a","uid":"uid-1"},`+
			`"status":{"allocation":{"devices":{"results":[{"request":"gpus","driver":"gpu-device-plugin.github.io","pool":"node-a","device":"gpu-0"}]}}}}`)
	}))
	defer srv.Close()
	kc, err := kubeapi.New(kubeapi.Config{Server: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	api := apiClaims{draapi.New(kc, 1e6, 1e6, testFieldManager)}
	c, err := api.GetClaim(context.Background(), "team-a", "train")
	if err != nil || c.UID != "uid-1" || len(c.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("GetClaim = %+v, %v", c, err)
	}
	if _, err := api.GetClaim(context.Background(), "team-a", "gone"); !apierrors.IsNotFound(err) {
		t.Errorf("a missing claim: %v, want NotFound", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"GET /apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/train", "GET /apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/gone"}
	if !slices.Equal(seen, want) {
		t.Errorf("requests %v, want %v", seen, want)
	}
}
