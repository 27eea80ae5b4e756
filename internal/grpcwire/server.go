package grpcwire

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"
)

// UnaryFunc answers one request message (its protobuf encoding).
type UnaryFunc func(ctx context.Context, req []byte) (Marshaler, error)

// StreamFunc answers one request message with the messages it sends until
// it returns. ctx ends when the client goes away or the server stops.
type StreamFunc func(ctx context.Context, req []byte, send func(Marshaler) error) error

type method struct {
	unary  UnaryFunc
	stream StreamFunc
}

// Server answers gRPC calls on the listeners it serves. Register every
// method before Serve.
type Server struct {
	methods map[string]method
	maxRecv int
	http    *http.Server
}

// NewServer returns a server with no methods. Errors of the HTTP/2 layer
// (a client that is not HTTP/2, say) go to log at debug level.
func NewServer(log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{methods: map[string]method{}, maxRecv: DefaultMaxMessage}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	s.http = &http.Server{
		Handler:   s,
		Protocols: &p,
		// gRPC clients keep one connection and open a stream per call;
		// grpc-go's own server sets no limit.
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: 1000},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return s
}

// HandleUnary answers calls of name (/package.Service/Method) with f.
func (s *Server) HandleUnary(name string, f UnaryFunc) { s.methods[name] = method{unary: f} }

// HandleStream answers server-streaming calls of name with f.
func (s *Server) HandleStream(name string, f StreamFunc) { s.methods[name] = method{stream: f} }

// Serve answers calls on ln until Stop. It returns nil after Stop, else
// the error that ended it.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.http.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Stop closes the listeners and every connection at once; calls in
// flight see their context end, and clients see the connection go.
func (s *Server) Stop() { s.http.Close() }

// ServeHTTP answers one call.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !isGRPC(r.Header.Get("Content-Type")) {
		http.Error(w, "this socket answers gRPC only", http.StatusUnsupportedMediaType)
		return
	}
	w.Header().Set("Content-Type", "application/grpc")
	m, ok := s.methods[r.URL.Path]
	if !ok {
		finish(w, false, Errorf(Unimplemented, "unknown method %s", r.URL.Path))
		return
	}
	ctx := r.Context()
	if v := r.Header.Get("Grpc-Timeout"); v != "" {
		d, err := parseTimeout(v)
		if err != nil {
			finish(w, false, Errorf(Internal, "%v", err))
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	req, err := readMessage(r.Body, s.maxRecv)
	if errors.Is(err, io.EOF) {
		err = Errorf(Internal, "%s: the call carried no request message", r.URL.Path)
	}
	if err != nil {
		finish(w, false, err)
		return
	}
	if m.unary != nil {
		resp, err := m.unary(ctx, req)
		if err != nil {
			finish(w, false, err)
			return
		}
		w.WriteHeader(http.StatusOK)
		_, err = w.Write(Frame(resp))
		finish(w, true, err)
		return
	}
	sent := false
	rc := http.NewResponseController(w)
	err = m.stream(ctx, req, func(msg Marshaler) error {
		if !sent {
			w.WriteHeader(http.StatusOK)
			sent = true
		}
		if _, err := w.Write(Frame(msg)); err != nil {
			return err
		}
		return rc.Flush()
	})
	finish(w, sent, err)
}

// finish sends the call's status: in the trailers after a response has
// begun, else in the headers of a response with no body (gRPC's
// trailers-only answer).
func finish(w http.ResponseWriter, begun bool, err error) {
	code := CodeOf(err)
	msg := ""
	if err != nil {
		var st *Status
		if errors.As(err, &st) {
			msg = st.Message
		} else {
			msg = err.Error()
		}
	}
	prefix := ""
	if begun {
		prefix = http.TrailerPrefix
	}
	h := w.Header()
	h.Set(prefix+"Grpc-Status", strconv.FormatUint(uint64(code), 10))
	if msg != "" {
		h.Set(prefix+"Grpc-Message", encodeMessage(msg))
	}
	if !begun {
		w.WriteHeader(http.StatusOK)
	}
}
