package kubeapitest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
)

var slicesResource = resourceapi.Resource("resourceslices")

// sliceFields are the fields a ResourceSlice list or watch may select on,
// as the API server allows them.
func sliceFields(s *resourceapi.ResourceSlice) fields.Set {
	f := fields.Set{
		"metadata.name":      s.Name,
		"metadata.namespace": s.Namespace,
		"spec.driver":        s.Spec.Driver,
		"spec.nodeName":      "",
		"spec.pool.name":     s.Spec.Pool.Name,
	}
	if s.Spec.NodeName != nil {
		f["spec.nodeName"] = *s.Spec.NodeName
	}
	return f
}

// selectors are a list's or watch's field and label selectors.
type selectors struct {
	fields fields.Selector
	labels labels.Selector
}

func (s selectors) matches(sl *resourceapi.ResourceSlice) bool {
	return s.fields.Matches(sliceFields(sl)) && s.labels.Matches(labels.Set(sl.Labels))
}

// parseSelectors reads the request's fieldSelector and labelSelector; an
// error is the API server's 400 for them.
func parseSelectors(r *http.Request) (selectors, error) {
	q := r.URL.Query()
	fs, err := fields.ParseSelector(q.Get("fieldSelector"))
	if err != nil {
		return selectors{}, apierrors.NewBadRequest(fmt.Sprintf("invalid field selector %q: %v", q.Get("fieldSelector"), err))
	}
	known := sliceFields(&resourceapi.ResourceSlice{})
	for _, req := range fs.Requirements() {
		if _, ok := known[req.Field]; !ok {
			return selectors{}, apierrors.NewBadRequest(fmt.Sprintf("unable to parse requirement: field label not supported: %s", req.Field))
		}
	}
	ls, err := labels.Parse(q.Get("labelSelector"))
	if err != nil {
		return selectors{}, apierrors.NewBadRequest(fmt.Sprintf("invalid label selector %q: %v", q.Get("labelSelector"), err))
	}
	return selectors{fields: fs, labels: ls}, nil
}

// listSlices lists the ResourceSlices the selectors match; the fake
// ignores field selectors, so they are applied here.
func (s *server) listSlices(w http.ResponseWriter, r *http.Request) {
	sel, err := parseSelectors(r)
	if err != nil {
		writeError(w, err)
		return
	}
	list, err := s.kube.ResourceV1().ResourceSlices().List(r.Context(), metav1.ListOptions{LabelSelector: sel.labels.String()})
	if err != nil {
		writeError(w, err)
		return
	}
	out := &resourceapi.ResourceSliceList{ListMeta: list.ListMeta, Items: []resourceapi.ResourceSlice{}}
	for i := range list.Items {
		if sel.matches(&list.Items[i]) {
			out.Items = append(out.Items, list.Items[i])
		}
	}
	if out.ResourceVersion == "" {
		s.mu.Lock()
		out.ResourceVersion = s.nextRV()
		s.mu.Unlock()
	}
	writeObject(w, http.StatusOK, out)
}

// watchEvent is one line of a watch's stream.
type watchEvent struct {
	Type   watch.EventType `json:"type"`
	Object runtime.Object  `json:"object"`
}

// watchSlices streams the fake's ResourceSlice events that the selectors
// match, one JSON object a line, until the client goes, timeoutSeconds
// pass or the test ends.
func (s *server) watchSlices(w http.ResponseWriter, r *http.Request) {
	sel, err := parseSelectors(r)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx := r.Context()
	if t := r.URL.Query().Get("timeoutSeconds"); t != "" {
		n, err := strconv.ParseInt(t, 10, 64)
		if err != nil || n < 0 {
			writeError(w, apierrors.NewBadRequest(fmt.Sprintf("timeoutSeconds=%q: not a whole number of seconds", t)))
			return
		}
		if n > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Duration(n)*time.Second)
			defer cancel()
		}
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeError(w, apierrors.NewInternalError(fmt.Errorf("the response writer cannot stream")))
		return
	}
	rv := r.URL.Query().Get("resourceVersion")
	if _, err := strconv.ParseUint(rv, 10, 64); rv != "" && err != nil {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("resourceVersion=%q: not a resource version", rv)))
		return
	}
	// With a resourceVersion (a list's), the fake first sends the objects
	// changed since; without one, every object, as the API server does.
	wi, err := s.kube.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{LabelSelector: sel.labels.String(), ResourceVersion: rv})
	if err != nil {
		writeError(w, err)
		return
	}
	defer wi.Stop()
	events := unbounded(ctx, wi.ResultChan())
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	enc := json.NewEncoder(w)
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if sl, ok := ev.Object.(*resourceapi.ResourceSlice); ok && !sel.matches(sl) {
				continue
			}
			if ev.Type == watch.Error {
				if st, ok := ev.Object.(*metav1.Status); ok {
					ev.Object = withStatusKind(st)
				}
			}
			if err := enc.Encode(watchEvent{Type: ev.Type, Object: withKind(ev.Object)}); err != nil {
				// The client has gone.
				return
			}
			flusher.Flush()
		}
	}
}

// unbounded passes on what comes in, however far behind the reader is:
// the fake's watcher panics when 100 events wait unread, which a client
// slow to read a burst of large slices would otherwise cause in whoever
// wrote them. It ends when in closes and all is passed on, or ctx ends.
func unbounded(ctx context.Context, in <-chan watch.Event) <-chan watch.Event {
	out := make(chan watch.Event)
	go func() {
		defer close(out)
		var queue []watch.Event
		for in != nil || len(queue) > 0 {
			var send chan<- watch.Event
			var next watch.Event
			if len(queue) > 0 {
				send, next = out, queue[0]
			}
			select {
			case ev, ok := <-in:
				if !ok {
					in = nil
					continue
				}
				queue = append(queue, ev)
			case send <- next:
				queue = queue[1:]
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

func withStatusKind(st *metav1.Status) *metav1.Status {
	st = st.DeepCopy()
	st.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}
	return st
}

// readSlice decodes a ResourceSlice from the request body.
func readSlice(w http.ResponseWriter, r *http.Request) (*resourceapi.ResourceSlice, bool) {
	var sl resourceapi.ResourceSlice
	if !decode(w, r, &sl) {
		return nil, false
	}
	if k := sl.Kind; k != "" && k != "ResourceSlice" || sl.APIVersion != "" && sl.APIVersion != resourceapi.SchemeGroupVersion.String() {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("the body is a %s %s, not a %s ResourceSlice", sl.APIVersion, sl.Kind, resourceapi.SchemeGroupVersion)))
		return nil, false
	}
	// The fake stores objects as given; the API server keeps no apiVersion
	// and kind in its typed objects either.
	sl.TypeMeta = metav1.TypeMeta{}
	return &sl, true
}

// createSlice creates a ResourceSlice, naming it from its generateName
// and setting uid, resourceVersion and creationTimestamp as the API server
// does.
func (s *server) createSlice(w http.ResponseWriter, r *http.Request) {
	sl, ok := readSlice(w, r)
	if !ok {
		return
	}
	if sl.Name == "" {
		if sl.GenerateName == "" {
			writeError(w, apierrors.NewInvalid(resourceapi.SchemeGroupVersion.WithKind("ResourceSlice").GroupKind(), "", field.ErrorList{
				field.Required(field.NewPath("metadata", "name"), "name or generateName is required"),
			}))
			return
		}
		sl.Name = sl.GenerateName + utilrand.String(5)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sl.UID = uuid.NewUUID()
	sl.ResourceVersion = s.nextRV()
	sl.CreationTimestamp = metav1.Now()
	reply(w, http.StatusCreated)(s.kube.ResourceV1().ResourceSlices().Create(r.Context(), sl, metav1.CreateOptions{FieldManager: r.URL.Query().Get("fieldManager")}))
}

// updateSlice replaces a ResourceSlice, refusing (409) a body whose
// resourceVersion is not the stored one, which the fake does not check.
func (s *server) updateSlice(w http.ResponseWriter, r *http.Request, name string) {
	sl, ok := readSlice(w, r)
	if !ok {
		return
	}
	if sl.Name != name {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", sl.Name, name)))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	slices := s.kube.ResourceV1().ResourceSlices()
	cur, err := slices.Get(r.Context(), name, metav1.GetOptions{})
	if err != nil {
		writeError(w, err)
		return
	}
	switch {
	case sl.ResourceVersion != "" && sl.ResourceVersion != cur.ResourceVersion:
		writeError(w, apierrors.NewConflict(slicesResource, name, errModified))
		return
	case sl.UID != "" && sl.UID != cur.UID:
		writeError(w, apierrors.NewConflict(slicesResource, name, fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", sl.UID, cur.UID)))
		return
	}
	// What the API server keeps from the stored object whatever the body
	// says.
	sl.UID, sl.CreationTimestamp = cur.UID, cur.CreationTimestamp
	sl.ResourceVersion = s.nextRV()
	reply(w, http.StatusOK)(slices.Update(r.Context(), sl, metav1.UpdateOptions{FieldManager: r.URL.Query().Get("fieldManager")}))
}

// deleteSlice deletes a ResourceSlice after checking the DeleteOptions'
// preconditions against it, which the fake does not.
func (s *server) deleteSlice(w http.ResponseWriter, r *http.Request, name string) {
	var o metav1.DeleteOptions
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("reading the request body: %v", err)))
		return
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := json.Unmarshal(body, &o); err != nil {
			writeError(w, apierrors.NewBadRequest(fmt.Sprintf("decoding DeleteOptions: %v", err)))
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	slices := s.kube.ResourceV1().ResourceSlices()
	cur, err := slices.Get(r.Context(), name, metav1.GetOptions{})
	if err != nil {
		writeError(w, err)
		return
	}
	if p := o.Preconditions; p != nil {
		if p.UID != nil && *p.UID != cur.UID {
			writeError(w, apierrors.NewConflict(slicesResource, name, fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", *p.UID, cur.UID)))
			return
		}
		if p.ResourceVersion != nil && *p.ResourceVersion != cur.ResourceVersion {
			writeError(w, apierrors.NewConflict(slicesResource, name, fmt.Errorf("Precondition failed: ResourceVersion in precondition: %v, ResourceVersion in object meta: %v", *p.ResourceVersion, cur.ResourceVersion)))
			return
		}
	}
	if err := slices.Delete(r.Context(), name, o); err != nil {
		writeError(w, err)
		return
	}
	writeObject(w, http.StatusOK, &metav1.Status{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status:   metav1.StatusSuccess,
		Details:  &metav1.StatusDetails{Name: name, Group: slicesResource.Group, Kind: "resourceslices", UID: cur.UID},
	})
}
