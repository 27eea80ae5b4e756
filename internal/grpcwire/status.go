package grpcwire

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Code is a gRPC status code. Only the codes this project sends or must
// tell apart are named; any other arrives as its number.
type Code uint32

// The gRPC status codes, numbered as gRPC numbers them.
const (
	OK                Code = 0
	Canceled          Code = 1
	Unknown           Code = 2
	InvalidArgument   Code = 3
	DeadlineExceeded  Code = 4
	NotFound          Code = 5
	ResourceExhausted Code = 8
	Unimplemented     Code = 12
	Internal          Code = 13
	Unavailable       Code = 14
)

var codeNames = [...]string{
	"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
	"OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
}

// String is the code's name as gRPC spells it.
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "Code(" + strconv.FormatUint(uint64(c), 10) + ")"
}

// Status is an RPC's failure: its code and message. Its text reads as
// grpc-go's does, so logs and tests that match on it keep working.
type Status struct {
	Code    Code
	Message string
}

func (s *Status) Error() string {
	return fmt.Sprintf("rpc error: code = %s desc = %s", s.Code, s.Message)
}

// Errorf returns a *Status with code c.
func Errorf(c Code, format string, a ...any) error {
	return &Status{Code: c, Message: fmt.Sprintf(format, a...)}
}

// CodeOf is err's code: OK for nil, the code of a *Status in its chain,
// Canceled or DeadlineExceeded for a context's error, else Unknown.
func CodeOf(err error) Code {
	var s *Status
	switch {
	case err == nil:
		return OK
	case errors.As(err, &s):
		return s.Code
	case errors.Is(err, context.DeadlineExceeded):
		return DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return Canceled
	}
	return Unknown
}

// encodeMessage percent-encodes a status message for the grpc-message
// header, as gRPC's protocol asks: bytes outside printable ASCII, and '%'.
func encodeMessage(m string) string {
	clean := true
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < ' ' || c > '~' || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return m
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(m); i++ {
		c := m[i]
		if c < ' ' || c > '~' || c == '%' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// decodeMessage undoes encodeMessage; a malformed escape is kept as sent.
func decodeMessage(m string) string {
	if !strings.Contains(m, "%") {
		return m
	}
	var b strings.Builder
	for i := 0; i < len(m); i++ {
		if m[i] == '%' && i+2 < len(m) {
			if v, err := strconv.ParseUint(m[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(m[i])
	}
	return b.String()
}
