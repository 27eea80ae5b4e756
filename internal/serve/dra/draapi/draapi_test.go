package draapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
)

type seen struct {
	method, path, query, contentType string
	body                             []byte
}

// server answers each request with the next of answers (code, body,
// Retry-After) and records it.
func server(t *testing.T, answers ...[3]string) (*Client, func() []seen) {
	t.Helper()
	var mu sync.Mutex
	var reqs []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		i := len(reqs)
		reqs = append(reqs, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), b})
		mu.Unlock()
		a := answers[min(i, len(answers)-1)]
		if a[2] != "" {
			w.Header().Set("Retry-After", a[2])
		}
		w.Header().Set("Content-Type", "application/json")
		var code int
		fmt.Sscan(a[0], &code)
		w.WriteHeader(code)
		io.WriteString(w, a[1])
	}))
	t.Cleanup(srv.Close)
	kc, err := kubeapi.New(kubeapi.Config{Server: srv.URL, FieldManager: "gpu-device-plugin"})
	if err != nil {
		t.Fatal(err)
	}
	return New(kc, 1e6, 1e6, "gpu-device-plugin"), func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), reqs...)
	}
}

const claimJSON = `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"c","namespace":"n","uid":"u1"}}`

// A 429 with Retry-After is waited out and tried again; the answer after
// is the call's.
func TestRetriesWhatTheServerAsks(t *testing.T) {
	c, reqs := server(t, [3]string{"429", `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429}`, "1"}, [3]string{"200", claimJSON})
	got, err := c.GetClaim(context.Background(), "n", "c")
	if err != nil || got.UID != "u1" {
		t.Fatalf("GetClaim = %v, %v", got, err)
	}
	if n := len(reqs()); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}

// An answer refused without Retry-After is not retried; errors read as
// the API's, whether or not the body was a Status.
func TestErrors(t *testing.T) {
	c, reqs := server(t, [3]string{"404", `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"resourceclaims \"c\" not found"}`})
	_, err := c.GetClaim(context.Background(), "n", "c")
	if !apierrors.IsNotFound(err) || len(reqs()) != 1 {
		t.Errorf("err %v after %d requests, want NotFound after 1", err, len(reqs()))
	}
	c, _ = server(t, [3]string{"409", `not json`})
	if err := c.DeleteSlice(context.Background(), "s", "uid", "7"); !apierrors.IsConflict(err) {
		t.Errorf("a 409 without a Status: %v, want Conflict", err)
	}
	c, _ = server(t, [3]string{"422", `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Invalid","code":422,"details":{"causes":[{"field":"status.devices[0].data","message":"too long"}]}}`})
	err = c.ApplyClaimStatus(context.Background(), "n", "c", "u1", map[string]any{})
	var st apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &st) || st.Status().Details == nil || len(st.Status().Details.Causes) != 1 {
		t.Errorf("a 422's causes: %v", err)
	}
}

// The status apply is a forced server-side apply of the status
// subresource, as our field manager, naming the claim's UID.
func TestApplyClaimStatus(t *testing.T) {
	c, reqs := server(t, [3]string{"200", claimJSON})
	if err := c.ApplyClaimStatus(context.Background(), "n", "c", "u1", map[string]any{"devices": []any{}}); err != nil {
		t.Fatal(err)
	}
	r := reqs()[0]
	if r.method != http.MethodPatch || r.path != "/apis/resource.k8s.io/v1/namespaces/n/resourceclaims/c/status" ||
		r.query != "fieldManager=gpu-device-plugin&force=true" || r.contentType != "application/apply-patch+yaml" {
		t.Errorf("request %+v", r)
	}
	var body struct {
		APIVersion, Kind string
		Metadata         metav1.ObjectMeta
	}
	if err := json.Unmarshal(r.body, &body); err != nil || body.APIVersion != "resource.k8s.io/v1" || body.Kind != "ResourceClaim" ||
		body.Metadata.UID != "u1" || body.Metadata.Name != "c" || body.Metadata.Namespace != "n" {
		t.Errorf("body %s", r.body)
	}
}

// A slice is deleted only as read: its UID and resourceVersion are the
// preconditions.
func TestDeleteSlicePreconditions(t *testing.T) {
	c, reqs := server(t, [3]string{"200", `{"kind":"Status","apiVersion":"v1","status":"Success"}`})
	if err := c.DeleteSlice(context.Background(), "s-1", "uid-1", "42"); err != nil {
		t.Fatal(err)
	}
	r := reqs()[0]
	var opts metav1.DeleteOptions
	if err := json.Unmarshal(r.body, &opts); err != nil || opts.Preconditions == nil || *opts.Preconditions.UID != "uid-1" ||
		*opts.Preconditions.ResourceVersion != "42" || r.method != http.MethodDelete || r.path != "/apis/resource.k8s.io/v1/resourceslices/s-1" {
		t.Errorf("request %+v %s", r, r.body)
	}
}

// The list and the watch are narrowed to the driver and the node.
func TestSliceSelector(t *testing.T) {
	if got, want := SliceSelector("d", "n"), "spec.driver=d,spec.nodeName=n"; got != want {
		t.Errorf("SliceSelector = %q, want %q", got, want)
	}
}
