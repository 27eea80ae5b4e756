package kubeapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Client makes the API calls. It is safe for concurrent use.
type Client struct {
	base      *url.URL
	http      *http.Client
	token     string
	tokenFile *cachedFile
	user      string
	password  string
	userAgent string
	manager   string
	observer  RequestObserver
	now       func() time.Time
}

// RequestObserver is told of every request the Client made: the API verb
// (get, create, patch), the resource (events, nodes, nodes/status, pods)
// and the HTTP status code, or "error" when no answer came. The metrics
// package counts them.
type RequestObserver interface {
	ObserveRequest(verb, resource, code string)
}

// Option changes a Client.
type Option func(*Client)

// WithRequestObserver tells o of every request.
func WithRequestObserver(o RequestObserver) Option {
	return func(c *Client) { c.observer = o }
}

// requestTimeout bounds one request, whatever the caller's context says:
// a hung API server must not hold up the caller's queue forever.
const requestTimeout = 30 * time.Second

// New builds a Client for c.
func New(c Config, opts ...Option) (*Client, error) {
	u, err := url.Parse(c.Server)
	if err != nil {
		return nil, fmt.Errorf("API server URL %q: %w", c.Server, err)
	}
	if u.Scheme != "https" && u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("API server URL %q: want https://host[:port]", c.Server)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	// InsecureSkipVerify only when the kubeconfig says so.
	tc := &tls.Config{InsecureSkipVerify: c.Insecure, ServerName: c.ServerName, MinVersion: tls.VersionTLS12}
	if len(c.CAData) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(c.CAData) {
			return nil, errors.New("API server CA: no PEM certificate in it")
		}
		tc.RootCAs = pool
	}
	switch {
	case len(c.CertData) > 0 || len(c.KeyData) > 0:
		cert, err := tls.X509KeyPair(c.CertData, c.KeyData)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	case c.CertFile != "" || c.KeyFile != "":
		kp := &keyPair{cert: cachedFile{path: c.CertFile}, key: cachedFile{path: c.KeyFile}}
		// Fail now on a bad pair rather than at the first request.
		if _, err := kp.get(); err != nil {
			return nil, err
		}
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get() }
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	tr.ForceAttemptHTTP2 = true
	cl := &Client{
		base:      u,
		http:      &http.Client{Transport: tr, Timeout: requestTimeout},
		token:     c.Token,
		user:      c.Username,
		password:  c.Password,
		userAgent: c.UserAgent,
		manager:   c.FieldManager,
		now:       time.Now,
	}
	for _, o := range opts {
		o(cl)
	}
	if c.TokenFile != "" {
		cl.tokenFile = &cachedFile{path: c.TokenFile}
		if _, err := cl.tokenFile.get(); err != nil {
			return nil, fmt.Errorf("bearer token: %w", err)
		}
	}
	return cl, nil
}

// CreateEvent creates e in its namespace (metadata.namespace, else
// involvedObject.namespace, else "default", where events about
// cluster-scoped objects such as Nodes go).
func (c *Client) CreateEvent(ctx context.Context, e Event) error {
	ns := cmpOr(e.Metadata.Namespace, e.InvolvedObject.Namespace, "default")
	e.Metadata.Namespace = ns
	return c.do(ctx, http.MethodPost, "events", "/api/v1/namespaces/"+url.PathEscape(ns)+"/events", "application/json", e, nil)
}

// PatchEvent updates an Event's count and lastTimestamp, as client-go's
// recorder does when the same event happens again.
func (c *Client) PatchEvent(ctx context.Context, namespace, name string, count int32, last Time) error {
	body := struct {
		Count         int32 `json:"count"`
		LastTimestamp Time  `json:"lastTimestamp"`
	}{count, last}
	return c.do(ctx, http.MethodPatch, "events", "/api/v1/namespaces/"+url.PathEscape(namespace)+"/events/"+url.PathEscape(name), "application/strategic-merge-patch+json", body, nil)
}

// GetPod reads a Pod.
func (c *Client) GetPod(ctx context.Context, namespace, name string) (Pod, error) {
	var p Pod
	err := c.do(ctx, http.MethodGet, "pods", "/api/v1/namespaces/"+url.PathEscape(namespace)+"/pods/"+url.PathEscape(name), "", nil, &p)
	return p, err
}

// nodeFeatures is the path of a namespace's NodeFeatures.
func nodeFeatures(namespace string) string {
	return "/apis/" + NodeFeatureAPIVersion + "/namespaces/" + url.PathEscape(namespace) + "/nodefeatures"
}

// GetNodeFeature reads a NodeFeature.
func (c *Client) GetNodeFeature(ctx context.Context, namespace, name string) (NodeFeature, error) {
	var f NodeFeature
	err := c.do(ctx, http.MethodGet, "nodefeatures", nodeFeatures(namespace)+"/"+url.PathEscape(name), "", nil, &f)
	return f, err
}

// CreateNodeFeature creates f in its namespace.
func (c *Client) CreateNodeFeature(ctx context.Context, f NodeFeature) error {
	f.APIVersion, f.Kind = NodeFeatureAPIVersion, NodeFeatureKind
	return c.do(ctx, http.MethodPost, "nodefeatures", nodeFeatures(f.Metadata.Namespace), "application/json", f, nil)
}

// UpdateNodeFeature replaces f; its resourceVersion, from the read it was
// made from, makes the API server refuse it (409) if another writer came
// in between.
func (c *Client) UpdateNodeFeature(ctx context.Context, f NodeFeature) error {
	f.APIVersion, f.Kind = NodeFeatureAPIVersion, NodeFeatureKind
	return c.do(ctx, http.MethodPut, "nodefeatures", nodeFeatures(f.Metadata.Namespace)+"/"+url.PathEscape(f.Metadata.Name), "application/json", f, nil)
}

// GetNode reads a Node.
func (c *Client) GetNode(ctx context.Context, name string) (Node, error) {
	var n Node
	err := c.do(ctx, http.MethodGet, "nodes", "/api/v1/nodes/"+url.PathEscape(name), "", nil, &n)
	return n, err
}

// PatchNodeCondition sets one condition of a Node's status: a strategic
// merge patch, which merges status.conditions by type, so the kubelet's
// conditions and other agents' are left alone.
func (c *Client) PatchNodeCondition(ctx context.Context, node string, cond NodeCondition) error {
	var body struct {
		Status struct {
			Conditions []NodeCondition `json:"conditions"`
		} `json:"status"`
	}
	body.Status.Conditions = []NodeCondition{cond}
	return c.do(ctx, http.MethodPatch, "nodes/status", "/api/v1/nodes/"+url.PathEscape(node)+"/status", "application/strategic-merge-patch+json", body, nil)
}

// PatchNodeMetadata changes a Node's labels and annotations as p says: a
// JSON merge patch, which leaves every key p does not name alone, so other
// agents' labels are never rewritten from a stale read.
func (c *Client) PatchNodeMetadata(ctx context.Context, node string, p MetadataPatch) error {
	body := struct {
		Metadata MetadataPatch `json:"metadata"`
	}{p}
	return c.do(ctx, http.MethodPatch, "nodes", "/api/v1/nodes/"+url.PathEscape(node), "application/merge-patch+json", body, nil)
}

// PatchNodeScheduling cordons or uncordons a Node and changes its
// annotations as p says, in one JSON merge patch.
func (c *Client) PatchNodeScheduling(ctx context.Context, node string, p SchedulingPatch) error {
	type spec struct {
		Unschedulable bool `json:"unschedulable"`
	}
	var body struct {
		Metadata struct {
			ResourceVersion string             `json:"resourceVersion,omitempty"`
			Annotations     map[string]*string `json:"annotations,omitempty"`
		} `json:"metadata"`
		Spec *spec `json:"spec,omitempty"`
	}
	body.Metadata.ResourceVersion, body.Metadata.Annotations = p.ResourceVersion, p.Annotations
	if p.Unschedulable != nil {
		body.Spec = &spec{*p.Unschedulable}
	}
	return c.do(ctx, http.MethodPatch, "nodes", "/api/v1/nodes/"+url.PathEscape(node), "application/merge-patch+json", body, nil)
}

func cmpOr(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// maxBody bounds what is read of a response: the objects read here are
// small, and a misbehaving server must not make us buffer gigabytes.
const maxBody = 4 << 20

func (c *Client) do(ctx context.Context, method, resource, path, contentType string, in, out any) error {
	return c.Do(ctx, Request{Method: method, Resource: resource, Path: path, ContentType: contentType, Body: in}, out)
}

// Request is one API call for Do.
type Request struct {
	// Method is the HTTP method; Resource names the resource for the
	// RequestObserver (resourceclaims, resourceslices, nodes/status).
	Method, Resource string
	// Path is the URL path from the server's root (/apis/...).
	Path string
	// Query is the URL's query; on writes, the client's field manager is
	// added unless Query names one.
	Query url.Values
	// ContentType is the body's type; Body is encoded as JSON.
	ContentType string
	Body        any
}

// Do makes r and decodes the answer into out (nil: not read). An answer
// other than 2xx is a *StatusError.
func (c *Client) Do(ctx context.Context, r Request, out any) error {
	resp, err := c.send(ctx, c.http, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("%s %s: reading the response: %w", r.Method, r.Path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := newStatusError(r.Method, r.Path, resp.StatusCode, data)
		e.RetryAfter = retryAfter(resp.Header, c.now())
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decoding the response: %w", r.Method, r.Path, err)
		}
	}
	return nil
}

// send makes r through hc; the caller closes the body.
func (c *Client) send(ctx context.Context, hc *http.Client, r Request) (*http.Response, error) {
	var body io.Reader
	if r.Body != nil {
		b, err := json.Marshal(r.Body)
		if err != nil {
			return nil, fmt.Errorf("%s %s: encoding the request: %w", r.Method, r.Path, err)
		}
		body = bytes.NewReader(b)
	}
	u := *c.base
	u.Path += r.Path
	q := r.Query
	if r.Method != http.MethodGet && r.Method != http.MethodDelete && c.manager != "" && !q.Has("fieldManager") {
		q = maps.Clone(q)
		if q == nil {
			q = url.Values{}
		}
		q.Set("fieldManager", c.manager)
	}
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, r.Method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", r.Method, r.Path, err)
	}
	req.Header.Set("Accept", "application/json")
	if r.ContentType != "" {
		req.Header.Set("Content-Type", r.ContentType)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	if err := c.authorize(req); err != nil {
		return nil, fmt.Errorf("%s %s: %w", r.Method, r.Path, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		c.observe(r.Method, r.Resource, "error")
		return nil, fmt.Errorf("%s %s: %w", r.Method, r.Path, err)
	}
	c.observe(r.Method, r.Resource, strconv.Itoa(resp.StatusCode))
	return resp, nil
}

// WatchEvent is one event of a watch: its type (ADDED, MODIFIED, DELETED,
// BOOKMARK, ERROR) and the object, undecoded.
type WatchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// Watch makes r, a GET with watch=true in its query, and hands each event
// to fn until the server ends the watch (nil), ctx ends, fn fails or the
// stream breaks. It is not bound by the client's request timeout: the
// caller sets timeoutSeconds in the query.
func (c *Client) Watch(ctx context.Context, r Request, fn func(WatchEvent) error) error {
	hc := &http.Client{Transport: c.http.Transport}
	resp, err := c.send(ctx, hc, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		e := newStatusError(r.Method, r.Path, resp.StatusCode, data)
		e.RetryAfter = retryAfter(resp.Header, c.now())
		return e
	}
	// The API server is trusted as the rest of the client trusts it: one
	// event is decoded whole, as client-go does.
	dec := json.NewDecoder(resp.Body)
	for {
		var ev WatchEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("watch %s: %w", r.Path, err)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}

// verb is the API's name for an HTTP method used.
func verb(method string) string {
	switch method {
	case http.MethodGet:
		return "get"
	case http.MethodPost:
		return "create"
	case http.MethodPatch:
		return "patch"
	case http.MethodPut:
		return "update"
	}
	return strings.ToLower(method)
}

func (c *Client) observe(method, resource, code string) {
	if c.observer != nil {
		c.observer.ObserveRequest(verb(method), resource, code)
	}
}

func (c *Client) authorize(req *http.Request) error {
	token := c.token
	if c.tokenFile != nil {
		b, err := c.tokenFile.get()
		if err != nil {
			return fmt.Errorf("bearer token: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	switch {
	case token != "":
		req.Header.Set("Authorization", "Bearer "+token)
	case c.user != "":
		req.SetBasicAuth(c.user, c.password)
	}
	return nil
}

// cachedFile is a file re-read only when its size or modification time
// changes: a projected token is replaced by an atomic symlink swap, which
// changes what os.Stat sees.
type cachedFile struct {
	path string

	mu   sync.Mutex
	mod  time.Time
	size int64
	data []byte
}

func (f *cachedFile) get() ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := os.Stat(f.path)
	if err != nil {
		if f.data != nil {
			// Keep what worked; the server says if it no longer does.
			return f.data, nil
		}
		return nil, err
	}
	if f.data != nil && st.ModTime().Equal(f.mod) && st.Size() == f.size {
		return f.data, nil
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		if f.data != nil {
			return f.data, nil
		}
		return nil, err
	}
	f.data, f.mod, f.size = b, st.ModTime(), st.Size()
	return b, nil
}

// keyPair is a client certificate and key re-read when either file
// changes; until a new pair parses, the last good one is used.
type keyPair struct {
	cert, key cachedFile

	mu       sync.Mutex
	lastCert []byte
	lastKey  []byte
	pair     *tls.Certificate
}

func (k *keyPair) get() (*tls.Certificate, error) {
	cb, err := k.cert.get()
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	kb, err := k.key.get()
	if err != nil {
		return nil, fmt.Errorf("client key: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pair != nil && bytes.Equal(cb, k.lastCert) && bytes.Equal(kb, k.lastKey) {
		return k.pair, nil
	}
	pair, err := tls.X509KeyPair(cb, kb)
	if err != nil {
		if k.pair != nil {
			// Mid-rotation, one file written and not yet the other.
			return k.pair, nil
		}
		return nil, fmt.Errorf("client certificate %s and key %s: %w", k.cert.path, k.key.path, err)
	}
	k.pair, k.lastCert, k.lastKey = &pair, cb, kb
	return k.pair, nil
}
