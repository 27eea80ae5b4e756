package kubeapitest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
)

// Serve starts an API server backed by kube and dyn (nil: every request
// for another API group is 404) and returns the Config that reaches it.
// The server stops when the test ends; open watches end first, so a
// client still watching does not hold the test up.
//
// It serves:
//
//	GET    /api/v1/nodes/{name}
//	PATCH  /api/v1/nodes/{name}[/status]
//	GET    /api/v1/namespaces/{ns}/events[/{name}]
//	POST   /api/v1/namespaces/{ns}/events
//	PATCH  /api/v1/namespaces/{ns}/events/{name}
//	GET    /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}
//	PATCH  /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}[/status]
//	GET    /apis/resource.k8s.io/v1/resourceslices (list; watch=true|1 streams)
//	POST   /apis/resource.k8s.io/v1/resourceslices
//	GET, PUT, DELETE /apis/resource.k8s.io/v1/resourceslices/{name}
//	GET    /apis/{group}/{version}/namespaces/{ns}/{resource}/{name} (dyn)
//	PATCH  /apis/{group}/{version}/namespaces/{ns}/{resource}/{name}[/status] (dyn)
//
// A patch is an apply (application/apply-patch+yaml, fieldManager
// required), a merge, a strategic merge or a JSON patch, as its
// Content-Type says. The dynamic fake cannot apply to an Unstructured:
// a test that has dyn serve an apply gives it a "patch" reactor, as the
// ComputeDomain controller's tests do. Anything else is a 404 Status
// naming the path.
func Serve(t testing.TB, kube *fake.Clientset, dyn dynamic.Interface) kubeapi.Config {
	t.Helper()
	c, stop := Start(kube, dyn, t.Logf)
	t.Cleanup(stop)
	return c
}

// Start is Serve for a program rather than a test (gpu-check's DRA step):
// logf gets what Serve logs, and stop stops the server.
func Start(kube *fake.Clientset, dyn dynamic.Interface, logf func(format string, args ...any)) (kubeapi.Config, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{logf: logf, kube: kube, dyn: dyn}
	srv := httptest.NewUnstartedServer(s)
	// Request contexts derive from ctx, so cancelling it ends the watches
	// that Close would otherwise wait for.
	srv.Config.BaseContext = func(net.Listener) context.Context { return ctx }
	srv.Start()
	return kubeapi.Config{Server: srv.URL}, func() {
		cancel()
		srv.Close()
	}
}

// maxBody bounds a request body; the API server's own limit is about 3 MiB.
const maxBody = 8 << 20

type server struct {
	logf func(format string, args ...any)
	kube *fake.Clientset
	dyn  dynamic.Interface

	// mu makes a check of a stored object and the write that depends on
	// it (an update's resourceVersion, a delete's preconditions) one step
	// for requests through this server.
	mu sync.Mutex
	// rv is the last resourceVersion this server set on an object.
	rv int64
}

// nextRV is a resourceVersion not given before. It starts high so that it
// is never below the fake's own list resourceVersions, which count from 1.
func (s *server) nextRV() string {
	s.rv++
	return strconv.FormatInt(1_000_000+s.rv, 10)
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	p := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if !s.route(w, r, p) {
		s.logf("kubeapitest: no route for %s %s", r.Method, r.URL.Path)
		writeError(w, apierrors.NewNotFound(schema.GroupResource{}, r.URL.Path))
	}
}

// route serves r if it names a path and method this server knows, and
// says whether it did.
func (s *server) route(w http.ResponseWriter, r *http.Request, p []string) bool {
	ctx := r.Context()
	switch {
	// /api/v1/nodes/{name}[/status]
	case match(p, "api", "v1", "nodes", "*"), match(p, "api", "v1", "nodes", "*", "status"):
		switch r.Method {
		case http.MethodGet:
			if len(p) != 4 {
				return false
			}
			reply(w, http.StatusOK)(s.kube.CoreV1().Nodes().Get(ctx, p[3], metav1.GetOptions{}))
		case http.MethodPatch:
			s.patch(w, r, corev1.Resource("nodes"), func(pt types.PatchType, body []byte, o metav1.PatchOptions) (runtime.Object, error) {
				return s.kube.CoreV1().Nodes().Patch(ctx, p[3], pt, body, o, p[4:]...)
			}, func() (runtime.Object, error) { return s.kube.CoreV1().Nodes().Get(ctx, p[3], metav1.GetOptions{}) })
		default:
			return false
		}
	// /api/v1/namespaces/{ns}/events
	case match(p, "api", "v1", "namespaces", "*", "events"):
		events := s.kube.CoreV1().Events(p[3])
		switch r.Method {
		case http.MethodGet:
			reply(w, http.StatusOK)(events.List(ctx, metav1.ListOptions{LabelSelector: r.URL.Query().Get("labelSelector")}))
		case http.MethodPost:
			var e corev1.Event
			if !decode(w, r, &e) {
				return true
			}
			reply(w, http.StatusCreated)(events.Create(ctx, &e, metav1.CreateOptions{FieldManager: r.URL.Query().Get("fieldManager")}))
		default:
			return false
		}
	// /api/v1/namespaces/{ns}/events/{name}
	case match(p, "api", "v1", "namespaces", "*", "events", "*"):
		events := s.kube.CoreV1().Events(p[3])
		switch r.Method {
		case http.MethodGet:
			reply(w, http.StatusOK)(events.Get(ctx, p[5], metav1.GetOptions{}))
		case http.MethodPatch:
			s.patch(w, r, corev1.Resource("events"), func(pt types.PatchType, body []byte, o metav1.PatchOptions) (runtime.Object, error) {
				return events.Patch(ctx, p[5], pt, body, o)
			}, func() (runtime.Object, error) { return events.Get(ctx, p[5], metav1.GetOptions{}) })
		default:
			return false
		}
	// /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}[/status]
	case match(p, "apis", "resource.k8s.io", "v1", "namespaces", "*", "resourceclaims", "*"),
		match(p, "apis", "resource.k8s.io", "v1", "namespaces", "*", "resourceclaims", "*", "status"):
		claims := s.kube.ResourceV1().ResourceClaims(p[4])
		switch r.Method {
		case http.MethodGet:
			reply(w, http.StatusOK)(claims.Get(ctx, p[6], metav1.GetOptions{}))
		case http.MethodPatch:
			s.patch(w, r, resourceapi.Resource("resourceclaims"), func(pt types.PatchType, body []byte, o metav1.PatchOptions) (runtime.Object, error) {
				return claims.Patch(ctx, p[6], pt, body, o, p[7:]...)
			}, func() (runtime.Object, error) { return claims.Get(ctx, p[6], metav1.GetOptions{}) })
		default:
			return false
		}
	// /apis/resource.k8s.io/v1/resourceslices
	case match(p, "apis", "resource.k8s.io", "v1", "resourceslices"):
		switch r.Method {
		case http.MethodGet:
			if q := r.URL.Query().Get("watch"); q == "true" || q == "1" {
				s.watchSlices(w, r)
			} else {
				s.listSlices(w, r)
			}
		case http.MethodPost:
			s.createSlice(w, r)
		default:
			return false
		}
	// /apis/resource.k8s.io/v1/resourceslices/{name}
	case match(p, "apis", "resource.k8s.io", "v1", "resourceslices", "*"):
		switch r.Method {
		case http.MethodGet:
			reply(w, http.StatusOK)(s.kube.ResourceV1().ResourceSlices().Get(ctx, p[4], metav1.GetOptions{}))
		case http.MethodPut:
			s.updateSlice(w, r, p[4])
		case http.MethodDelete:
			s.deleteSlice(w, r, p[4])
		default:
			return false
		}
	// /apis/{group}/{version}/namespaces/{ns}/{resource}/{name}[/status]
	case match(p, "apis", "*", "*", "namespaces", "*", "*", "*"),
		match(p, "apis", "*", "*", "namespaces", "*", "*", "*", "status"):
		if r.Method != http.MethodGet && r.Method != http.MethodPatch || r.Method == http.MethodGet && len(p) != 7 {
			return false
		}
		s.dynamic(w, r, schema.GroupVersionResource{Group: p[1], Version: p[2], Resource: p[5]}, p[4], p[6], p[7:])
	default:
		return false
	}
	return true
}

// match says whether the path segments p are pattern, where "*" stands
// for any one non-empty segment.
func match(p []string, pattern ...string) bool {
	if len(p) != len(pattern) {
		return false
	}
	for i, want := range pattern {
		if p[i] == "" || want != "*" && p[i] != want {
			return false
		}
	}
	return true
}

// dynamic serves a get or a patch of any other API group's object through
// dyn.
func (s *server) dynamic(w http.ResponseWriter, r *http.Request, gvr schema.GroupVersionResource, ns, name string, sub []string) {
	if s.dyn == nil {
		writeError(w, apierrors.NewNotFound(gvr.GroupResource(), name))
		return
	}
	ri := s.dyn.Resource(gvr).Namespace(ns)
	ctx := r.Context()
	get := func() (runtime.Object, error) { return ri.Get(ctx, name, metav1.GetOptions{}) }
	if r.Method == http.MethodGet {
		reply(w, http.StatusOK)(get())
		return
	}
	s.patch(w, r, gvr.GroupResource(), func(pt types.PatchType, body []byte, o metav1.PatchOptions) (runtime.Object, error) {
		return ri.Patch(ctx, name, pt, body, o, sub...)
	}, get)
}

// patchTypes are the patch content types the API server takes.
var patchTypes = map[string]types.PatchType{
	"application/apply-patch+yaml":           types.ApplyPatchType,
	"application/merge-patch+json":           types.MergePatchType,
	"application/strategic-merge-patch+json": types.StrategicMergePatchType,
	"application/json-patch+json":            types.JSONPatchType,
}

// patch applies the request's patch with do, after the checks the API
// server makes and the fake does not: an apply names its field manager,
// and a resourceVersion in the patch must be the stored object's (got by
// get).
func (s *server) patch(w http.ResponseWriter, r *http.Request, gr schema.GroupResource, do func(types.PatchType, []byte, metav1.PatchOptions) (runtime.Object, error), get func() (runtime.Object, error)) {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	pt := patchTypes[ct]
	if pt == "" {
		writeError(w, &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusUnsupportedMediaType, Reason: metav1.StatusReasonUnsupportedMediaType,
			Message: fmt.Sprintf("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got %q", r.Header.Get("Content-Type")),
		}})
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("reading the request body: %v", err)))
		return
	}
	q := r.URL.Query()
	o := metav1.PatchOptions{FieldManager: q.Get("fieldManager")}
	if f := q.Get("force"); f != "" {
		force, err := strconv.ParseBool(f)
		if err != nil {
			writeError(w, apierrors.NewBadRequest(fmt.Sprintf("force=%q: not a boolean", f)))
			return
		}
		o.Force = &force
	}
	if pt == types.ApplyPatchType && o.FieldManager == "" {
		writeError(w, apierrors.NewBadRequest("PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"))
		return
	}
	if pt != types.ApplyPatchType && o.Force != nil {
		writeError(w, apierrors.NewBadRequest("PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch"))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if want := patchRV(pt, body); want != "" {
		cur, err := get()
		if err != nil {
			writeError(w, err)
			return
		}
		if m, ok := cur.(metav1.Object); ok && m.GetResourceVersion() != want {
			writeError(w, apierrors.NewConflict(gr, m.GetName(), errModified))
			return
		}
	}
	reply(w, http.StatusOK)(do(pt, body, o))
}

// patchRV is the metadata.resourceVersion a merge, strategic merge or
// apply patch carries, which makes the API server apply it only to that
// version of the object; empty when it carries none or is not JSON (the
// fake then reports the bad patch).
func patchRV(pt types.PatchType, body []byte) string {
	if pt == types.JSONPatchType {
		return ""
	}
	var p struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if json.Unmarshal(body, &p) != nil {
		return ""
	}
	return p.Metadata.ResourceVersion
}

// errModified is the API server's reason for refusing a write made from a
// stale read.
var errModified = errors.New("the object has been modified; please apply your changes to the latest version and try again")

// decode reads the request's JSON body into v, answering 400 when it is
// not.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("decoding the request body: %v", err)))
		return false
	}
	return true
}

// reply returns a function that writes a client call's result: the object
// with code, or the error as the API server would.
func reply(w http.ResponseWriter, code int) func(runtime.Object, error) {
	return func(obj runtime.Object, err error) {
		if err != nil {
			writeError(w, err)
			return
		}
		writeObject(w, code, obj)
	}
}

// writeObject writes obj as JSON with its apiVersion and kind, which the
// fake's typed objects lack and the API server always sends.
func writeObject(w http.ResponseWriter, code int, obj runtime.Object) {
	data, err := json.Marshal(withKind(obj))
	if err != nil {
		writeError(w, apierrors.NewInternalError(fmt.Errorf("encoding the answer: %w", err)))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(data, '\n'))
}

// withKind is obj, copied, with its apiVersion and kind set from the
// client-go scheme when it has none.
func withKind(obj runtime.Object) runtime.Object {
	if obj == nil || !obj.GetObjectKind().GroupVersionKind().Empty() {
		return obj
	}
	gvks, _, err := scheme.Scheme.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return obj
	}
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(gvks[0])
	return obj
}

// writeError writes err as the API server does: a Status with its code,
// reason and message. An error that is not an API status (the fake's own
// failures) is a 500.
func writeError(w http.ResponseWriter, err error) {
	writeStatus(w, status(err))
}

func status(err error) metav1.Status {
	var se apierrors.APIStatus
	var st metav1.Status
	if errors.As(err, &se) {
		st = se.Status()
	} else {
		st = apierrors.NewInternalError(err).Status()
	}
	st.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}
	st.Status = metav1.StatusFailure
	if st.Code == 0 {
		st.Code = http.StatusInternalServerError
	}
	return st
}

func writeStatus(w http.ResponseWriter, st metav1.Status) {
	data, err := json.Marshal(st)
	if err != nil {
		// A Status always encodes; keep the code at least.
		http.Error(w, err.Error(), int(st.Code))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(st.Code))
	_, _ = w.Write(append(data, '\n'))
}
