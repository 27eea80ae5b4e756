package kubeapitest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
)

// call makes one request and returns the answer's code and body.
func call(t *testing.T, c kubeapi.Config, method, path, contentType, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, c.Server+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	return resp.StatusCode, data
}

// callInto is call, decoding a 2xx answer into out and failing on another
// code than want.
func callInto(t *testing.T, c kubeapi.Config, method, path, contentType, body string, want int, out any) {
	t.Helper()
	code, data := call(t, c, method, path, contentType, body)
	if code != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, code, data, want)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: decoding %s: %v", method, path, data, err)
		}
	}
}

// wantStatus checks that an answer is a Status with code and reason.
func wantStatus(t *testing.T, code int, data []byte, wantCode int, wantReason metav1.StatusReason) metav1.Status {
	t.Helper()
	var st metav1.Status
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("answer %d %s is not a Status: %v", code, data, err)
	}
	if code != wantCode || st.Kind != "Status" || st.APIVersion != "v1" || int(st.Code) != wantCode || st.Reason != wantReason {
		t.Fatalf("answer %d %s, want a %d %s Status", code, data, wantCode, wantReason)
	}
	return st
}

func slice(name, driver, node, pool string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"driver": driver}},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: driver,
			Pool:   resourceapi.ResourcePool{Name: pool, ResourceSliceCount: 1},
		},
	}
	if node != "" {
		s.Spec.NodeName = &node
	} else {
		s.Spec.AllNodes = ptr(true)
	}
	return s
}

func ptr[T any](v T) *T { return &v }

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const slicesPath = "/apis/resource.k8s.io/v1/resourceslices"

func TestCreateSliceWithGenerateName(t *testing.T) {
	kube := fake.NewClientset()
	c := Serve(t, kube, nil)
	s := slice("", "gpu.example.com", "n1", "n1")
	s.GenerateName = "n1-gpu.example.com-"
	var got resourceapi.ResourceSlice
	callInto(t, c, http.MethodPost, slicesPath, "application/json", mustJSON(t, s), http.StatusCreated, &got)
	if !strings.HasPrefix(got.Name, s.GenerateName) || len(got.Name) != len(s.GenerateName)+5 {
		t.Errorf("name %q, want %q and 5 characters", got.Name, s.GenerateName)
	}
	if got.Kind != "ResourceSlice" || got.APIVersion != "resource.k8s.io/v1" || got.UID == "" || got.ResourceVersion == "" || got.CreationTimestamp.IsZero() {
		t.Errorf("created %+v, want apiVersion, kind, uid, resourceVersion and creationTimestamp set", got.ObjectMeta)
	}
	stored, err := kube.ResourceV1().ResourceSlices().Get(context.Background(), got.Name, metav1.GetOptions{})
	if err != nil || stored.Spec.Driver != "gpu.example.com" || stored.UID != got.UID {
		t.Errorf("the fake holds %+v, %v; want the created slice", stored, err)
	}

	code, data := call(t, c, http.MethodPost, slicesPath, "application/json", mustJSON(t, slice("", "d", "n1", "p")))
	wantStatus(t, code, data, http.StatusUnprocessableEntity, metav1.StatusReasonInvalid)
	code, data = call(t, c, http.MethodPost, slicesPath, "application/json", "{")
	wantStatus(t, code, data, http.StatusBadRequest, metav1.StatusReasonBadRequest)
	code, data = call(t, c, http.MethodPost, slicesPath, "application/json", mustJSON(t, slice(got.Name, "d", "n1", "p")))
	wantStatus(t, code, data, http.StatusConflict, metav1.StatusReasonAlreadyExists)
}

func TestListSlicesFilters(t *testing.T) {
	kube := fake.NewClientset(
		slice("a", "gpu.example.com", "n1", "n1"),
		slice("b", "gpu.example.com", "n2", "n2"),
		slice("c", "nic.example.com", "n1", "n1"),
		slice("d", "gpu.example.com", "", "fabric"),
	)
	c := Serve(t, kube, nil)
	for _, tc := range []struct {
		name, query string
		want        []string
	}{
		{"everything", "", []string{"a", "b", "c", "d"}},
		{"by driver", "fieldSelector=spec.driver%3Dgpu.example.com", []string{"a", "b", "d"}},
		{"by node and driver", "fieldSelector=spec.nodeName%3Dn1,spec.driver%3Dgpu.example.com", []string{"a"}},
		{"by pool", "fieldSelector=spec.pool.name%3Dfabric", []string{"d"}},
		{"by name", "fieldSelector=metadata.name%3Db", []string{"b"}},
		{"not on a node", "fieldSelector=spec.nodeName%3D", []string{"d"}},
		{"by field and label", "fieldSelector=spec.nodeName%3Dn1&labelSelector=driver%3Dnic.example.com", []string{"c"}},
		{"with a resourceVersion", "resourceVersion=0&fieldSelector=spec.nodeName!%3Dn1", []string{"b", "d"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l resourceapi.ResourceSliceList
			callInto(t, c, http.MethodGet, slicesPath+"?"+tc.query, "", "", http.StatusOK, &l)
			var names []string
			for _, s := range l.Items {
				names = append(names, s.Name)
			}
			if strings.Join(names, ",") != strings.Join(tc.want, ",") {
				t.Errorf("listed %v, want %v", names, tc.want)
			}
			if l.Kind != "ResourceSliceList" || l.APIVersion != "resource.k8s.io/v1" || l.ResourceVersion == "" {
				t.Errorf("list %+v %+v, want apiVersion, kind and resourceVersion", l.TypeMeta, l.ListMeta)
			}
		})
	}
	for _, tc := range []struct{ name, query string }{
		{"an unknown field", "fieldSelector=spec.devices%3Dx"},
		{"a bad field selector", "fieldSelector=spec.driver%3D%3D%3Dx,("},
		{"a bad label selector", "labelSelector=a%20in%20(b"},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			code, data := call(t, c, http.MethodGet, slicesPath+"?"+tc.query, "", "")
			wantStatus(t, code, data, http.StatusBadRequest, metav1.StatusReasonBadRequest)
		})
	}
}

// watchEventOf is a watch event as a client decodes it.
type watchEventOf struct {
	Type   string                    `json:"type"`
	Object resourceapi.ResourceSlice `json:"object"`
}

func TestWatchSlices(t *testing.T) {
	kube := fake.NewClientset()
	c := Serve(t, kube, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Server+slicesPath+"?watch=true&fieldSelector=spec.nodeName%3Dn1", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("watch answered %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// The headers came after the fake's watch was set up, so these changes
	// reach it.
	slices := kube.ResourceV1().ResourceSlices()
	if _, err := slices.Create(ctx, slice("other", "d", "n2", "n2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mine, err := slices.Create(ctx, slice("mine", "d", "n1", "n1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mine.Spec.Pool.Generation = 2
	if _, err := slices.Update(ctx, mine, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := slices.Delete(ctx, "mine", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	var got []string
	for len(got) < 3 && sc.Scan() {
		var ev watchEventOf
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event %s: %v", sc.Bytes(), err)
		}
		if ev.Object.Kind != "ResourceSlice" || ev.Object.APIVersion != "resource.k8s.io/v1" {
			t.Errorf("event %s: the object has no apiVersion and kind", sc.Bytes())
		}
		got = append(got, ev.Type+" "+ev.Object.Name)
	}
	if want := "ADDED mine,MODIFIED mine,DELETED mine"; strings.Join(got, ",") != want {
		t.Errorf("events %v, want %s (err %v)", got, want, sc.Err())
	}
}

// openWatch starts a watch of slicesPath with query; the events are read
// from the returned scanner. It ends with the test.
func openWatch(t *testing.T, c kubeapi.Config, query string) *bufio.Scanner {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, c.Server+slicesPath+"?watch=true&"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("watch answered %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	return sc
}

// nextEvent reads one event, as "TYPE name".
func nextEvent(t *testing.T, sc *bufio.Scanner) string {
	t.Helper()
	if !sc.Scan() {
		t.Fatalf("the watch ended: %v", sc.Err())
	}
	var ev watchEventOf
	if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
		t.Fatalf("event %.200s: %v", sc.Bytes(), err)
	}
	return ev.Type + " " + ev.Object.Name
}

func TestWatchFromAList(t *testing.T) {
	kube := fake.NewClientset(slice("old", "d", "n1", "n1"))
	c := Serve(t, kube, nil)
	var l resourceapi.ResourceSliceList
	callInto(t, c, http.MethodGet, slicesPath, "", "", http.StatusOK, &l)
	if _, err := kube.ResourceV1().ResourceSlices().Create(t.Context(), slice("new", "d", "n1", "n1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc := openWatch(t, c, "resourceVersion="+l.ResourceVersion)
	if got := nextEvent(t, sc); got != "ADDED new" {
		t.Errorf("first event %q, want the slice created after the list", got)
	}

	sc = openWatch(t, c, "")
	got := []string{nextEvent(t, sc), nextEvent(t, sc)}
	if strings.Join(got, ",") != "ADDED old,ADDED new" && strings.Join(got, ",") != "ADDED new,ADDED old" {
		t.Errorf("events %v, want every slice added, as a watch without a resourceVersion starts", got)
	}

	code, data := call(t, c, http.MethodGet, slicesPath+"?watch=true&resourceVersion=abc", "", "")
	wantStatus(t, code, data, http.StatusBadRequest, metav1.StatusReasonBadRequest)
}

func TestWatchBurstWhileTheClientDoesNotRead(t *testing.T) {
	kube := fake.NewClientset()
	c := Serve(t, kube, nil)
	sc := openWatch(t, c, "")
	// Far more than the fake's watcher holds (100 events) and than the
	// connection buffers, so the server must keep them while the client
	// does not read.
	const n = 300
	big := strings.Repeat("x", 32<<10)
	for i := range n {
		s := slice(fmt.Sprintf("s%03d", i), "d", "n1", "n1")
		s.Annotations = map[string]string{"big": big}
		if _, err := kube.ResourceV1().ResourceSlices().Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if got, want := nextEvent(t, sc), fmt.Sprintf("ADDED s%03d", i); got != want {
			t.Fatalf("event %d: %q, want %q", i, got, want)
		}
	}
}

func TestWatchEnds(t *testing.T) {
	t.Run("after timeoutSeconds", func(t *testing.T) {
		c := Serve(t, fake.NewClientset(), nil)
		start := time.Now()
		code, data := call(t, c, http.MethodGet, slicesPath+"?watch=1&timeoutSeconds=1", "", "")
		if code != http.StatusOK || len(data) != 0 {
			t.Errorf("watch answered %d %s, want 200 and no events", code, data)
		}
		if d := time.Since(start); d < time.Second {
			t.Errorf("watch ended after %v, want 1s", d)
		}
	})
	t.Run("when the test ends with the watch open", func(t *testing.T) {
		var resp *http.Response
		t.Run("open", func(t *testing.T) {
			c := Serve(t, fake.NewClientset(), nil)
			var err error
			resp, err = http.Get(c.Server + slicesPath + "?watch=true")
			if err != nil {
				t.Fatal(err)
			}
		})
		defer resp.Body.Close()
		// Serve's clean-up returned, so the server has ended the stream.
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Logf("the stream ended with %v", err)
		}
	})
	t.Run("refusing a bad timeout", func(t *testing.T) {
		c := Serve(t, fake.NewClientset(), nil)
		code, data := call(t, c, http.MethodGet, slicesPath+"?watch=true&timeoutSeconds=x", "", "")
		wantStatus(t, code, data, http.StatusBadRequest, metav1.StatusReasonBadRequest)
	})
}

func TestUpdateSlice(t *testing.T) {
	kube := fake.NewClientset()
	c := Serve(t, kube, nil)
	var created, updated resourceapi.ResourceSlice
	callInto(t, c, http.MethodPost, slicesPath, "application/json", mustJSON(t, slice("a", "d", "n1", "n1")), http.StatusCreated, &created)

	created.Spec.Pool.Generation = 2
	callInto(t, c, http.MethodPut, slicesPath+"/a", "application/json", mustJSON(t, created), http.StatusOK, &updated)
	if updated.ResourceVersion == created.ResourceVersion || updated.UID != created.UID || updated.Spec.Pool.Generation != 2 {
		t.Errorf("updated %+v, want a new resourceVersion, the same uid, generation 2", updated)
	}
	if s, err := kube.ResourceV1().ResourceSlices().Get(context.Background(), "a", metav1.GetOptions{}); err != nil || s.Spec.Pool.Generation != 2 {
		t.Errorf("the fake holds %+v, %v; want generation 2", s, err)
	}

	stale := created.DeepCopy()
	stale.Spec.Pool.Generation = 3
	code, data := call(t, c, http.MethodPut, slicesPath+"/a", "application/json", mustJSON(t, stale))
	wantStatus(t, code, data, http.StatusConflict, metav1.StatusReasonConflict)

	unconditional := stale.DeepCopy()
	unconditional.ResourceVersion = ""
	callInto(t, c, http.MethodPut, slicesPath+"/a", "application/json", mustJSON(t, unconditional), http.StatusOK, nil)

	code, data = call(t, c, http.MethodPut, slicesPath+"/b", "application/json", mustJSON(t, unconditional))
	wantStatus(t, code, data, http.StatusBadRequest, metav1.StatusReasonBadRequest)
	code, data = call(t, c, http.MethodPut, slicesPath+"/gone", "application/json", mustJSON(t, slice("gone", "d", "n1", "n1")))
	wantStatus(t, code, data, http.StatusNotFound, metav1.StatusReasonNotFound)
}

func TestDeleteSlicePreconditions(t *testing.T) {
	kube := fake.NewClientset()
	c := Serve(t, kube, nil)
	var s resourceapi.ResourceSlice
	callInto(t, c, http.MethodPost, slicesPath, "application/json", mustJSON(t, slice("a", "d", "n1", "n1")), http.StatusCreated, &s)
	for _, tc := range []struct {
		name string
		pre  metav1.Preconditions
	}{
		{"another uid", metav1.Preconditions{UID: ptr(s.UID + "x")}},
		{"another resourceVersion", metav1.Preconditions{ResourceVersion: ptr(s.ResourceVersion + "0")}},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			code, data := call(t, c, http.MethodDelete, slicesPath+"/a", "application/json", mustJSON(t, metav1.DeleteOptions{Preconditions: &tc.pre}))
			st := wantStatus(t, code, data, http.StatusConflict, metav1.StatusReasonConflict)
			if !strings.Contains(st.Message, "Precondition failed") {
				t.Errorf("message %q, want it to say the precondition failed", st.Message)
			}
			if _, err := kube.ResourceV1().ResourceSlices().Get(context.Background(), "a", metav1.GetOptions{}); err != nil {
				t.Errorf("the slice is gone: %v", err)
			}
		})
	}
	ok := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion}}
	callInto(t, c, http.MethodDelete, slicesPath+"/a", "application/json", mustJSON(t, ok), http.StatusOK, nil)
	if _, err := kube.ResourceV1().ResourceSlices().Get(context.Background(), "a", metav1.GetOptions{}); err == nil {
		t.Error("the slice is still in the fake")
	}
	code, data := call(t, c, http.MethodDelete, slicesPath+"/a", "", "")
	wantStatus(t, code, data, http.StatusNotFound, metav1.StatusReasonNotFound)
	code, data = call(t, c, http.MethodDelete, slicesPath+"/a", "application/json", "{")
	wantStatus(t, code, data, http.StatusBadRequest, metav1.StatusReasonBadRequest)
}

func TestClaimStatus(t *testing.T) {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim", UID: "claim-uid"}}
	kube := fake.NewClientset(claim)
	c := Serve(t, kube, nil)
	path := "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim"

	var got resourceapi.ResourceClaim
	callInto(t, c, http.MethodGet, path, "", "", http.StatusOK, &got)
	if got.Kind != "ResourceClaim" || got.APIVersion != "resource.k8s.io/v1" || got.UID != "claim-uid" {
		t.Errorf("got %+v %+v, want the claim with its apiVersion and kind", got.TypeMeta, got.ObjectMeta)
	}
	code, data := call(t, c, http.MethodGet, "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/other", "", "")
	wantStatus(t, code, data, http.StatusNotFound, metav1.StatusReasonNotFound)

	apply := `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"claim","namespace":"ns"},
		"status":{"devices":[{"driver":"gpu.example.com","pool":"n1","device":"gpu-0","conditions":[
		{"type":"Ready","status":"True","reason":"Prepared","lastTransitionTime":"2025-01-01T00:00:00Z"}]}]}}`
	callInto(t, c, http.MethodPatch, path+"/status?fieldManager=gpu.example.com&force=true", "application/apply-patch+yaml", apply, http.StatusOK, &got)
	stored, err := kube.ResourceV1().ResourceClaims("ns").Get(context.Background(), "claim", metav1.GetOptions{})
	if err != nil || len(stored.Status.Devices) != 1 || stored.Status.Devices[0].Device != "gpu-0" {
		t.Fatalf("the fake holds %+v, %v; want the applied device status", stored, err)
	}
	if len(got.Status.Devices) != 1 {
		t.Errorf("the answer %+v lacks the applied status", got.Status)
	}

	merge := `{"status":{"devices":[{"driver":"gpu.example.com","pool":"n1","device":"gpu-1"}]}}`
	callInto(t, c, http.MethodPatch, path+"/status", "application/merge-patch+json", merge, http.StatusOK, nil)
	if stored, err = kube.ResourceV1().ResourceClaims("ns").Get(context.Background(), "claim", metav1.GetOptions{}); err != nil || len(stored.Status.Devices) != 1 || stored.Status.Devices[0].Device != "gpu-1" {
		t.Errorf("the fake holds %+v, %v; want the merged device status", stored, err)
	}

	for _, tc := range []struct {
		name, query, contentType, body string
		code                           int
		reason                         metav1.StatusReason
	}{
		{"an apply without a field manager", "", "application/apply-patch+yaml", apply, http.StatusBadRequest, metav1.StatusReasonBadRequest},
		{"force on a merge patch", "?force=true", "application/merge-patch+json", merge, http.StatusBadRequest, metav1.StatusReasonBadRequest},
		{"an unknown content type", "", "text/plain", merge, http.StatusUnsupportedMediaType, metav1.StatusReasonUnsupportedMediaType},
		{"a stale resourceVersion", "", "application/merge-patch+json", `{"metadata":{"resourceVersion":"41"}}`, http.StatusConflict, metav1.StatusReasonConflict},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			code, data := call(t, c, http.MethodPatch, path+"/status"+tc.query, tc.contentType, tc.body)
			wantStatus(t, code, data, tc.code, tc.reason)
		})
	}
}

func TestNodesAndEventsThroughTheClient(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "node-uid", ResourceVersion: "7", Labels: map[string]string{"a": "b"}}}
	kube := fake.NewClientset(node)
	c := Serve(t, kube, nil)
	cl, err := kubeapi.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	n, err := cl.GetNode(ctx, "n1")
	if err != nil || n.Metadata.UID != "node-uid" || n.Metadata.Labels["a"] != "b" {
		t.Fatalf("GetNode: %+v, %v", n, err)
	}
	if _, err := cl.GetNode(ctx, "n2"); !kubeapi.IsNotFound(err) {
		t.Errorf("GetNode of a missing node: %v, want NotFound", err)
	}

	now := kubeapi.NewTime(time.Now())
	cond := kubeapi.NodeCondition{Type: "GPUHealthy", Status: kubeapi.ConditionTrue, Reason: "AllGood", LastHeartbeatTime: now, LastTransitionTime: now}
	if err := cl.PatchNodeCondition(ctx, "n1", cond); err != nil {
		t.Fatalf("PatchNodeCondition: %v", err)
	}
	stored, err := kube.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil || len(stored.Status.Conditions) != 1 || stored.Status.Conditions[0].Reason != "AllGood" {
		t.Errorf("the fake holds %+v, %v; want the condition", stored, err)
	}

	on := true
	err = cl.PatchNodeScheduling(ctx, "n1", kubeapi.SchedulingPatch{Unschedulable: &on, ResourceVersion: "6"})
	if kubeapi.Classify(err) != kubeapi.Transient || !strings.Contains(err.Error(), "409") {
		t.Errorf("PatchNodeScheduling from a stale read: %v, want 409 Conflict", err)
	}
	if err := cl.PatchNodeScheduling(ctx, "n1", kubeapi.SchedulingPatch{Unschedulable: &on, ResourceVersion: "7"}); err != nil {
		t.Errorf("PatchNodeScheduling: %v", err)
	}
	if stored, err = kube.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil || !stored.Spec.Unschedulable {
		t.Errorf("the fake holds %+v, %v; want the node cordoned", stored.Spec, err)
	}

	ev := kubeapi.Event{
		Metadata:       kubeapi.ObjectMeta{Name: "n1.gpu"},
		InvolvedObject: kubeapi.ObjectReference{Kind: "Node", Name: "n1", UID: "node-uid"},
		Reason:         "XID", Message: "xid 79", Type: kubeapi.EventWarning, Count: 1,
		FirstTimestamp: now, LastTimestamp: now,
	}
	if err := cl.CreateEvent(ctx, ev); err != nil {
		t.Fatalf("CreateEvent: %v", err)
	}
	if err := cl.CreateEvent(ctx, ev); !kubeapi.IsAlreadyExists(err) {
		t.Errorf("CreateEvent again: %v, want AlreadyExists", err)
	}
	if err := cl.PatchEvent(ctx, "default", "n1.gpu", 2, now); err != nil {
		t.Fatalf("PatchEvent: %v", err)
	}
	e, err := kube.CoreV1().Events("default").Get(ctx, "n1.gpu", metav1.GetOptions{})
	if err != nil || e.Count != 2 || e.Reason != "XID" {
		t.Errorf("the fake holds %+v, %v; want the event with count 2", e, err)
	}
	var l corev1.EventList
	callInto(t, c, http.MethodGet, "/api/v1/namespaces/default/events", "", "", http.StatusOK, &l)
	if l.Kind != "EventList" || len(l.Items) != 1 || l.Items[0].Name != "n1.gpu" {
		t.Errorf("listed %+v, want the one event", l)
	}
}

func TestUnknownPath(t *testing.T) {
	c := Serve(t, fake.NewClientset(), nil)
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/apis/resource.k8s.io/v1/deviceclasses"},
		{http.MethodGet, "/healthz"},
		{http.MethodPost, "/api/v1/nodes/n1"},
		{http.MethodDelete, "/api/v1/namespaces/ns/events/e"},
		{http.MethodGet, "/api/v1/nodes//status"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			code, data := call(t, c, tc.method, tc.path, "", "")
			st := wantStatus(t, code, data, http.StatusNotFound, metav1.StatusReasonNotFound)
			if !strings.Contains(st.Message, tc.path) {
				t.Errorf("message %q does not name the path", st.Message)
			}
		})
	}
}

var computeDomains = schema.GroupVersionResource{Group: "resource.nvidia.com", Version: "v1beta1", Resource: "computedomains"}

func TestDynamic(t *testing.T) {
	cd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "resource.nvidia.com/v1beta1",
		"kind":       "ComputeDomain",
		"metadata":   map[string]any{"name": "cd", "namespace": "ns", "uid": "cd-uid"},
		"spec":       map[string]any{"numNodes": int64(2)},
	}}
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{computeDomains: "ComputeDomainList"}, cd)
	// The dynamic fake cannot apply to an Unstructured (it tries a
	// strategic merge, which needs a Go type), so tests give it a reactor,
	// as the ComputeDomain controller's do; this one checks what the
	// server passed on.
	var applied []string
	dyn.PrependReactor("patch", "computedomains", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		o := pa.(k8stesting.PatchActionImpl).PatchOptions
		applied = append(applied, fmt.Sprintf("%s %s/%s %s %s force=%v", pa.GetPatchType(), pa.GetNamespace(), pa.GetName(), pa.GetSubresource(), o.FieldManager, o.Force != nil && *o.Force))
		var body struct {
			Status map[string]any `json:"status"`
		}
		if err := json.Unmarshal(pa.GetPatch(), &body); err != nil {
			return true, nil, err
		}
		cur, err := dyn.Tracker().Get(computeDomains, pa.GetNamespace(), pa.GetName())
		if err != nil {
			return true, nil, err
		}
		u := cur.(*unstructured.Unstructured).DeepCopy()
		u.Object["status"] = body.Status
		return true, u, dyn.Tracker().Update(computeDomains, u, pa.GetNamespace())
	})
	c := Serve(t, fake.NewClientset(), dyn)
	path := "/apis/resource.nvidia.com/v1beta1/namespaces/ns/computedomains/cd"

	var got unstructured.Unstructured
	callInto(t, c, http.MethodGet, path, "", "", http.StatusOK, &got.Object)
	if got.GetKind() != "ComputeDomain" || got.GetUID() != "cd-uid" {
		t.Errorf("got %v, want the ComputeDomain", got.Object)
	}
	code, data := call(t, c, http.MethodGet, "/apis/resource.nvidia.com/v1beta1/namespaces/ns/computedomains/other", "", "")
	wantStatus(t, code, data, http.StatusNotFound, metav1.StatusReasonNotFound)

	apply := `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"ComputeDomain","metadata":{"name":"cd","namespace":"ns"},
		"status":{"status":"Ready","nodes":[{"name":"n1","status":"Ready"}]}}`
	callInto(t, c, http.MethodPatch, path+"/status?fieldManager=cd-daemon&force=true", "application/apply-patch+yaml", apply, http.StatusOK, nil)
	if want := "application/apply-patch+yaml ns/cd status cd-daemon force=true"; strings.Join(applied, ";") != want {
		t.Errorf("the fake was asked %q, want %q", applied, want)
	}
	stored, err := dyn.Resource(computeDomains).Namespace("ns").Get(context.Background(), "cd", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s, _, _ := unstructured.NestedString(stored.Object, "status", "status"); s != "Ready" {
		t.Errorf("the fake holds %v, want status.status Ready", stored.Object)
	}
	if n, _, _ := unstructured.NestedInt64(stored.Object, "spec", "numNodes"); n != 2 {
		t.Errorf("the fake holds %v, want spec kept", stored.Object)
	}

	t.Run("without a dynamic client", func(t *testing.T) {
		c := Serve(t, fake.NewClientset(), nil)
		code, data := call(t, c, http.MethodGet, path, "", "")
		wantStatus(t, code, data, http.StatusNotFound, metav1.StatusReasonNotFound)
	})
}
