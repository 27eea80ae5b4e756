// Package grpcwire speaks gRPC's wire protocol over the standard
// library's HTTP/2 without TLS, for the few unary and server-streaming
// calls the kubelet's device-plugin and PodResources APIs need.
//
// Why not grpc-go: on Linux the whole executable is resident once it runs,
// and grpc-go with protobuf's runtime is about 3.5 MB of it; net/http is
// linked anyway (the API server client, metrics). The protocol is small:
// an HTTP/2 POST to /package.Service/Method with content type
// application/grpc, each message framed by a compressed flag and a 4-byte
// big-endian length, and the outcome in the grpc-status and grpc-message
// trailers (or headers, when nothing else is sent). The tests run it
// against grpc-go's client and server, which the kubelet uses.
package grpcwire

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Marshaler is a message that appends its protobuf encoding to b.
type Marshaler interface {
	AppendProto(b []byte) []byte
}

// DefaultMaxMessage bounds a received message unless told otherwise. The
// kubelet's PodResources answer on a busy node outgrows gRPC's 4 MiB.
const DefaultMaxMessage = 16 << 20

const frameHeader = 5

// Frame returns m's encoding behind the 5-byte gRPC message header.
func Frame(m Marshaler) []byte {
	b := m.AppendProto(make([]byte, frameHeader, 256))
	b[0] = 0 // not compressed
	binary.BigEndian.PutUint32(b[1:frameHeader], uint32(len(b)-frameHeader))
	return b
}

// readMessage reads one length-prefixed message. It returns io.EOF when
// the stream ends cleanly before a message starts.
func readMessage(r io.Reader, limit int) ([]byte, error) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return nil, Errorf(Internal, "message header cut short")
		}
		return nil, err
	}
	if h[0] != 0 {
		return nil, Errorf(Unimplemented, "compressed messages are not supported (flag %d)", h[0])
	}
	n := binary.BigEndian.Uint32(h[1:])
	if int64(n) > int64(limit) {
		return nil, Errorf(ResourceExhausted, "message of %d bytes is over the %d-byte limit", n, limit)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, Errorf(Internal, "message of %d bytes cut short: %v", n, err)
	}
	return b, nil
}

// isGRPC reports whether a content type is gRPC's (application/grpc, or
// application/grpc+proto and the like).
func isGRPC(contentType string) bool {
	rest, ok := strings.CutPrefix(contentType, "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

// parseTimeout reads a grpc-timeout header: at most 8 digits and a unit.
func parseTimeout(v string) (time.Duration, error) {
	if len(v) < 2 || len(v) > 9 {
		return 0, fmt.Errorf("grpc-timeout %q: want 1 to 8 digits and a unit", v)
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("grpc-timeout %q: not a count", v)
	}
	var u time.Duration
	switch v[len(v)-1] {
	case 'H':
		u = time.Hour
	case 'M':
		u = time.Minute
	case 'S':
		u = time.Second
	case 'm':
		u = time.Millisecond
	case 'u':
		u = time.Microsecond
	case 'n':
		u = time.Nanosecond
	default:
		return 0, fmt.Errorf("grpc-timeout %q: unknown unit", v)
	}
	if n > int64(math.MaxInt64/u) {
		return math.MaxInt64, nil // 99999999H: longer than a Duration holds
	}
	return time.Duration(n) * u, nil
}

// formatTimeout writes d as a grpc-timeout header, rounded up to keep at
// most 8 digits.
func formatTimeout(d time.Duration) string {
	if d <= 0 {
		return "1n"
	}
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{time.Nanosecond, "n"}, {time.Microsecond, "u"}, {time.Millisecond, "m"}, {time.Second, "S"}, {time.Minute, "M"}} {
		if n := ceilDiv(d, u.unit); n < 1e8 {
			return strconv.FormatInt(n, 10) + u.name
		}
	}
	return strconv.FormatInt(ceilDiv(d, time.Hour), 10) + "H"
}

// httpCode maps an HTTP status that is not 200 to a gRPC code, as gRPC's
// protocol says a client should.
func httpCode(status int) Code {
	switch status {
	case http.StatusBadRequest:
		return Internal
	case http.StatusUnauthorized:
		return 16 // Unauthenticated
	case http.StatusForbidden:
		return 7 // PermissionDenied
	case http.StatusNotFound:
		return Unimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return Unavailable
	}
	return Unknown
}

func ceilDiv(d, unit time.Duration) int64 {
	n := int64(d / unit)
	if d%unit != 0 {
		n++
	}
	return n
}
