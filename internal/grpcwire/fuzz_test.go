package grpcwire

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

type raw []byte

func (r raw) AppendProto(b []byte) []byte { return append(b, r...) }

// FuzzServerFrames feeds the server any bytes after a valid preface and
// SETTINGS: it must neither panic nor keep the connection once the client
// hangs up.
func FuzzServerFrames(f *testing.F) {
	// Seeds: a whole unary call, and one cut short.
	var hb []byte
	{
		var buf bytesBuffer
		enc := hpack.NewEncoder(&buf)
		for _, hf := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: "/t.T/Echo"}, {Name: ":authority", Value: "x"}, {Name: "content-type", Value: "application/grpc"}, {Name: "grpc-timeout", Value: "5S"}} {
			enc.WriteField(hf)
		}
		hb = buf
	}
	var call bytesBuffer
	fr := http2.NewFramer(&call, nil)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb, EndHeaders: true})
	fr.WriteData(1, true, []byte{0, 0, 0, 0, 3, 'a', 'b', 'c'})
	fr.WritePing(false, [8]byte{1})
	fr.WriteWindowUpdate(0, 100)
	fr.WriteRSTStream(3, http2.ErrCodeCancel)
	f.Add([]byte(call))
	f.Add([]byte(call[:len(call)/2]))
	f.Add([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0})

	s := NewServer(nil)
	s.HandleUnary("/t.T/Echo", func(_ context.Context, b []byte) (Marshaler, error) { return raw(b), nil })
	s.HandleStream("/t.T/Stream", func(ctx context.Context, b []byte, send func(Marshaler) error) error {
		if err := send(raw(b)); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	})
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		c := newConn(s, server)
		done := make(chan struct{})
		go func() { c.serve(); close(done) }()
		go io.Copy(io.Discard, client)
		io.WriteString(client, http2.ClientPreface)
		cf := http2.NewFramer(client, nil)
		cf.WriteSettings()
		client.Write(in)
		client.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection outlived its client by 10 s")
		}
	})
}

type bytesBuffer []byte

func (b *bytesBuffer) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }
