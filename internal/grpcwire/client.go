package grpcwire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Client makes unary calls to a gRPC server on a unix socket. It dials
// when a call needs a connection, so a server that restarts is found
// again by the next call.
type Client struct {
	tr      *http.Transport
	maxRecv int
}

// NewClient returns a client of the server listening on socket. A
// response larger than maxRecv bytes fails the call; zero means
// DefaultMaxMessage.
func NewClient(socket string, maxRecv int) *Client {
	if maxRecv <= 0 {
		maxRecv = DefaultMaxMessage
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &Client{
		tr: &http.Transport{
			Protocols: &p,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", socket)
			},
			DisableCompression: true,
		},
		maxRecv: maxRecv,
	}
}

// Close closes the client's connections.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// Call sends req to method (/package.Service/Method) and returns the
// response message's encoding. Its error is a *Status: Unavailable when
// the server could not be reached, the server's code when it answered
// with one, and the context's code when ctx ended first.
func (c *Client) Call(ctx context.Context, method string, req Marshaler) ([]byte, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://localhost"+method, bytes.NewReader(Frame(req)))
	if err != nil {
		return nil, Errorf(Internal, "%s: %v", method, err)
	}
	hreq.Header = http.Header{
		"Content-Type": {"application/grpc"},
		"Te":           {"trailers"},
		"User-Agent":   {"gpu-device-plugin-grpcwire"},
	}
	if dl, ok := ctx.Deadline(); ok {
		hreq.Header.Set("Grpc-Timeout", formatTimeout(time.Until(dl)))
	}
	resp, err := c.tr.RoundTrip(hreq)
	if err != nil {
		return nil, transportError(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, Errorf(httpCode(resp.StatusCode), "%s: HTTP status %d", method, resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !isGRPC(ct) {
		return nil, Errorf(Internal, "%s: content type %q is not gRPC's", method, ct)
	}
	if st := resp.Header.Get("Grpc-Status"); st != "" {
		// Trailers-only: an answer with no message.
		if err := statusOf(st, resp.Header.Get("Grpc-Message")); err != nil {
			return nil, err
		}
		return nil, Errorf(Internal, "%s: the server sent no response message", method)
	}
	msg, err := readMessage(resp.Body, c.maxRecv)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, transportError(ctx, err)
	}
	got := err == nil
	// The status follows the body; reading to its end gets the trailers.
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return nil, transportError(ctx, err)
	}
	st := resp.Trailer.Get("Grpc-Status")
	if st == "" {
		return nil, Errorf(Internal, "%s: the server sent no grpc-status", method)
	}
	if err := statusOf(st, resp.Trailer.Get("Grpc-Message")); err != nil {
		return nil, err
	}
	if !got {
		return nil, Errorf(Internal, "%s: the server sent no response message", method)
	}
	return msg, nil
}

// statusOf is a grpc-status header's error; nil for OK.
func statusOf(code, msg string) error {
	n, err := strconv.ParseUint(code, 10, 32)
	if err != nil {
		return Errorf(Internal, "malformed grpc-status %q", code)
	}
	if n == 0 {
		return nil
	}
	return &Status{Code: Code(n), Message: decodeMessage(msg)}
}

// transportError is a failure below gRPC as a *Status: the context's code
// when it ended, a *Status as it is, else Unavailable. A deadline that has
// passed counts even before ctx says so: the server enforces the same
// deadline (grpc-timeout) and may reset the stream first.
func transportError(ctx context.Context, err error) error {
	var st *Status
	dl, ok := ctx.Deadline()
	switch {
	case ctx.Err() != nil:
		return &Status{Code: CodeOf(ctx.Err()), Message: err.Error()}
	case ok && !time.Now().Before(dl):
		return &Status{Code: DeadlineExceeded, Message: err.Error()}
	case errors.As(err, &st):
		return err
	}
	return &Status{Code: Unavailable, Message: fmt.Sprintf("connection: %v", err)}
}
