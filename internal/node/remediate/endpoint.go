package remediate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
)

// The remediation's paths on the plugin's health socket (never on the
// metrics port: only who can exec into the plugin's pod reaches the
// socket).
const (
	PathStatus  = "/remediation"
	PathRelease = "/remediation/release"
)

// The codes of an Answer's refusal, which tell the cases apart.
const (
	CodeOff         = "off"
	CodeStarting    = "starting"
	CodeStopped     = "stopped"
	CodeUnknownGPU  = "unknownGPU"
	CodeNotTerminal = "notTerminal"
	CodeBadRequest  = "badRequest"
)

// ReleaseRequest is the body of POST PathRelease.
type ReleaseRequest struct {
	GPU string `json:"gpu"`
}

// Answer is the endpoint's JSON answer: the GPUs' status (GET
// PathStatus), the released GPU as it was (POST PathRelease), or a
// refusal: Error in words, Code, and State for CodeNotTerminal.
type Answer struct {
	GPUs     []remedy.Status `json:"gpus,omitempty"`
	Released *remedy.Status  `json:"released,omitempty"`
	Error    string          `json:"error,omitempty"`
	Code     string          `json:"code,omitempty"`
	State    remedy.State    `json:"state,omitempty"`
}

// Endpoint answers the remediation's questions on the health socket. The
// socket answers before the GPUs are found, so the Endpoint exists before
// its Service: until Serve or Off it says the remediation is starting.
type Endpoint struct {
	mu  sync.Mutex
	svc *Service
	off string
}

// Serve has the Endpoint answer for svc.
func (e *Endpoint) Serve(svc *Service) {
	e.mu.Lock()
	e.svc, e.off = svc, ""
	e.mu.Unlock()
}

// Off has the Endpoint refuse every question, saying why there is no
// remediation ("remediation.enabled is false").
func (e *Endpoint) Off(why string) {
	e.mu.Lock()
	e.svc, e.off = nil, why
	e.mu.Unlock()
}

func (e *Endpoint) service() (*Service, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.svc, e.off
}

// Handler answers GET PathStatus and POST PathRelease.
func (e *Endpoint) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathStatus, func(w http.ResponseWriter, r *http.Request) {
		svc, ok := e.ready(w)
		if !ok {
			return
		}
		st := svc.Status(r.Context())
		if st == nil {
			reply(w, http.StatusServiceUnavailable, Answer{Code: CodeStopped, Error: ErrStopped.Error()})
			return
		}
		reply(w, http.StatusOK, Answer{GPUs: st})
	})
	mux.HandleFunc("POST "+PathRelease, func(w http.ResponseWriter, r *http.Request) {
		var req ReleaseRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || req.GPU == "" {
			reply(w, http.StatusBadRequest, Answer{Code: CodeBadRequest, Error: `the body must be {"gpu": "GPU-<uuid>"}`})
			return
		}
		svc, ok := e.ready(w)
		if !ok {
			return
		}
		st, err := svc.Release(r.Context(), req.GPU)
		var nt *remedy.NotTerminalError
		switch {
		case err == nil:
			reply(w, http.StatusOK, Answer{Released: &st})
		case errors.Is(err, remedy.ErrUnknownGPU):
			reply(w, http.StatusNotFound, Answer{Code: CodeUnknownGPU, Error: err.Error()})
		case errors.As(err, &nt):
			reply(w, http.StatusConflict, Answer{Code: CodeNotTerminal, Error: err.Error(), State: nt.State})
		default:
			reply(w, http.StatusServiceUnavailable, Answer{Code: CodeStopped, Error: err.Error()})
		}
	})
	return mux
}

// ready is the Endpoint's service, or false once it has answered why
// there is none.
func (e *Endpoint) ready(w http.ResponseWriter) (*Service, bool) {
	svc, off := e.service()
	switch {
	case svc != nil:
		return svc, true
	case off != "":
		reply(w, http.StatusServiceUnavailable, Answer{Code: CodeOff, Error: "remediation is off on this plugin: " + off})
	default:
		reply(w, http.StatusServiceUnavailable, Answer{Code: CodeStarting, Error: "remediation has not started yet: the plugin is still finding its GPUs; try again"})
	}
	return nil, false
}

func reply(w http.ResponseWriter, code int, a Answer) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(a)
}

// Refusals a Client returns (besides remedy.ErrUnknownGPU and
// *remedy.NotTerminalError), each wrapped in an error with the plugin's
// words.
var (
	ErrOff      = errors.New("remediation is off")
	ErrStarting = errors.New("remediation has not started yet")
)

type refusal struct {
	msg string
	is  error
}

func (r *refusal) Error() string { return r.msg }
func (r *refusal) Unwrap() error { return r.is }

// Client asks a running plugin's remediation on its health socket.
type Client struct {
	Socket string
}

// Status is every GPU's remediation, those no longer on the node last.
func (c Client) Status(ctx context.Context) ([]remedy.Status, error) {
	a, err := c.ask(ctx, http.MethodGet, PathStatus, nil)
	if err != nil {
		return nil, err
	}
	return a.GPUs, nil
}

// Release asks the plugin to give gpu back, and returns its status before.
func (c Client) Release(ctx context.Context, gpu string) (remedy.Status, error) {
	body, err := json.Marshal(ReleaseRequest{GPU: gpu})
	if err != nil {
		return remedy.Status{}, err
	}
	a, err := c.ask(ctx, http.MethodPost, PathRelease, body)
	if err != nil {
		var nt *remedy.NotTerminalError
		if errors.As(err, &nt) {
			nt.GPU = gpu
		}
		return remedy.Status{}, err
	}
	if a.Released == nil {
		return remedy.Status{}, fmt.Errorf("the plugin on %s answered no GPU", c.Socket)
	}
	return *a.Released, nil
}

func (c Client) ask(ctx context.Context, method, path string, body []byte) (Answer, error) {
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", c.Socket)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, method, "http://plugin"+path, bytes.NewReader(body))
	if err != nil {
		return Answer{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return Answer{}, fmt.Errorf("asking the plugin on %s: %w", c.Socket, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return Answer{}, fmt.Errorf("reading the plugin's answer on %s: %w", c.Socket, err)
	}
	var a Answer
	if err := json.Unmarshal(b, &a); err != nil {
		if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
			return Answer{}, fmt.Errorf("the plugin on %s does not answer %s: it is a release without the remediation command", c.Socket, path)
		}
		return Answer{}, fmt.Errorf("the plugin on %s answered %s: %s", c.Socket, resp.Status, bytes.TrimSpace(b))
	}
	if resp.StatusCode == http.StatusOK {
		return a, nil
	}
	switch a.Code {
	case CodeOff:
		return a, &refusal{a.Error, ErrOff}
	case CodeStarting:
		return a, &refusal{a.Error, ErrStarting}
	case CodeStopped:
		return a, &refusal{a.Error, ErrStopped}
	case CodeUnknownGPU:
		return a, &refusal{a.Error, remedy.ErrUnknownGPU}
	case CodeNotTerminal:
		return a, &remedy.NotTerminalError{State: a.State}
	}
	return a, fmt.Errorf("the plugin on %s answered %s: %s", c.Socket, resp.Status, a.Error)
}
