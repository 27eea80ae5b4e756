package grpcwire_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
)

// socketPath is a fresh socket path short enough for sun_path.
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "grpcwire")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "s.sock")
}

// pb sends a message of k8s.io/kubelet's generated code.
type pb struct{ m proto.Message }

func (p pb) AppendProto(b []byte) []byte {
	out, err := proto.MarshalOptions{}.MarshalAppend(b, p.m)
	if err != nil {
		panic(err)
	}
	return out
}

// serve runs s on a fresh socket until the test ends.
func serve(t *testing.T, s *grpcwire.Server) string {
	t.Helper()
	path := socketPath(t)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve after Stop = %v, want nil", err)
		}
	})
	return path
}

// grpcGoClient dials path as the kubelet does (authority "localhost")
// or, with the socket path as authority, as grpc-go's passthrough does.
func grpcGoClient(t *testing.T, path string, kubeletStyle bool) pluginapi.DevicePluginClient {
	t.Helper()
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	}
	if kubeletStyle {
		opts = append(opts, grpc.WithAuthority("localhost"))
	}
	conn, err := grpc.NewClient("passthrough:///"+path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// testServer answers Allocate by echoing each container's IDs into an
// env var, fails it with the message in a request's first ID when that
// starts with "fail:", and streams ListAndWatch until told to stop.
func testServer(t *testing.T, streamEnded chan<- error, deadlines chan<- time.Duration) *grpcwire.Server {
	s := grpcwire.NewServer(nil)
	s.HandleUnary("/v1beta1.DevicePlugin/Allocate", func(ctx context.Context, b []byte) (grpcwire.Marshaler, error) {
		if dl, ok := ctx.Deadline(); ok && deadlines != nil {
			deadlines <- time.Until(dl)
		}
		var req pluginapi.AllocateRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			return nil, grpcwire.Errorf(grpcwire.InvalidArgument, "%v", err)
		}
		resp := &pluginapi.AllocateResponse{}
		for _, c := range req.ContainerRequests {
			if msg, ok := strings.CutPrefix(c.DevicesIds[0], "fail:"); ok {
				return nil, grpcwire.Errorf(grpcwire.InvalidArgument, "%s", msg)
			}
			resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"IDS": strings.Join(c.DevicesIds, ",")}})
		}
		return pb{resp}, nil
	})
	s.HandleStream("/v1beta1.DevicePlugin/ListAndWatch", func(ctx context.Context, _ []byte, send func(grpcwire.Marshaler) error) error {
		for i := range 3 {
			if err := send(pb{&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{{ID: string(rune('a' + i)), Health: pluginapi.Healthy}}}}); err != nil {
				streamEnded <- err
				return err
			}
		}
		<-ctx.Done()
		streamEnded <- ctx.Err()
		return nil
	})
	return s
}

func TestServerAnswersGRPCGo(t *testing.T) {
	for _, kubeletStyle := range []bool{true, false} {
		name := "authority localhost"
		if !kubeletStyle {
			name = "authority the socket path"
		}
		t.Run(name, func(t *testing.T) {
			ended := make(chan error, 1)
			deadlines := make(chan time.Duration, 4)
			c := grpcGoClient(t, serve(t, testServer(t, ended, deadlines)), kubeletStyle)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-a", "GPU-b"}}, {DevicesIds: []string{"GPU-c"}}}})
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			if len(resp.ContainerResponses) != 2 || resp.ContainerResponses[0].Envs["IDS"] != "GPU-a,GPU-b" || resp.ContainerResponses[1].Envs["IDS"] != "GPU-c" {
				t.Errorf("Allocate answered %v", resp)
			}
			if d := <-deadlines; d <= 25*time.Second || d > 30*time.Second {
				t.Errorf("the handler's deadline is %v away, want the client's 30 s", d)
			}

			// A status with a message that needs percent-encoding.
			msg := "100% bad: device \"GPU-ä\"\nnext line"
			_, err = c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"fail:" + msg}}}})
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != msg {
				t.Errorf("failed Allocate = %v (%q), want InvalidArgument %q", st.Code(), st.Message(), msg)
			}

			if _, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{}); status.Code(err) != codes.Unimplemented {
				t.Errorf("a method the server lacks = %v, want Unimplemented", err)
			}

			sctx, stop := context.WithCancel(ctx)
			stream, err := c.ListAndWatch(sctx, &pluginapi.Empty{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				m, err := stream.Recv()
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				if got := m.Devices[0].ID; got != string(rune('a'+i)) {
					t.Errorf("message %d is %q", i, got)
				}
			}
			stop()
			if err := <-ended; !errors.Is(err, context.Canceled) {
				t.Errorf("the stream handler ended with %v, want its context cancelled", err)
			}
		})
	}
}

// TestStopEndsStreams: Stop ends a stream in flight on both sides.
func TestStopEndsStreams(t *testing.T) {
	ended := make(chan error, 1)
	s := testServer(t, ended, nil)
	path := socketPath(t)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	c := grpcGoClient(t, path, true)
	stream, err := c.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	s.Stop()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("the stream handler ended with %v, want its context cancelled", err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
		t.Errorf("the client's stream after Stop: %v, want Unavailable", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve = %v after Stop", err)
	}
}

// registration is a grpc-go Registration server (the kubelet's side).
type registration struct {
	pluginapi.UnimplementedRegistrationServer
	got   chan *pluginapi.RegisterRequest
	err   error
	block bool
}

func (r *registration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if r.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	r.got <- req
	return &pluginapi.Empty{}, r.err
}

func grpcGoServer(t *testing.T, r *registration) string {
	t.Helper()
	path := socketPath(t)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, r)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return path
}

func TestClientCallsGRPCGo(t *testing.T) {
	ctx := context.Background()
	req := &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "x.sock", ResourceName: "example.com/gpu", Options: &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}}

	t.Run("ok", func(t *testing.T) {
		r := &registration{got: make(chan *pluginapi.RegisterRequest, 1)}
		c := grpcwire.NewClient(grpcGoServer(t, r), 0)
		defer c.Close()
		b, err := c.Call(ctx, "/v1beta1.Registration/Register", pb{req})
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != 0 {
			t.Errorf("Empty answer has %d bytes", len(b))
		}
		if got := <-r.got; !proto.Equal(got, req) {
			t.Errorf("server got %v, want %v", got, req)
		}
	})
	t.Run("status", func(t *testing.T) {
		msg := "refused: 50% of \"ä\""
		r := &registration{got: make(chan *pluginapi.RegisterRequest, 1), err: status.Error(codes.InvalidArgument, msg)}
		c := grpcwire.NewClient(grpcGoServer(t, r), 0)
		defer c.Close()
		_, err := c.Call(ctx, "/v1beta1.Registration/Register", pb{req})
		var st *grpcwire.Status
		if !errors.As(err, &st) || st.Code != grpcwire.InvalidArgument || st.Message != msg {
			t.Errorf("Call = %v, want InvalidArgument %q", err, msg)
		}
	})
	t.Run("unknown method", func(t *testing.T) {
		c := grpcwire.NewClient(grpcGoServer(t, &registration{}), 0)
		defer c.Close()
		if _, err := c.Call(ctx, "/v1beta1.Registration/Nope", pb{req}); grpcwire.CodeOf(err) != grpcwire.Unimplemented {
			t.Errorf("Call = %v, want Unimplemented", err)
		}
	})
	t.Run("nobody listening", func(t *testing.T) {
		c := grpcwire.NewClient(filepath.Join(t.TempDir(), "none.sock"), 0)
		defer c.Close()
		if _, err := c.Call(ctx, "/v1beta1.Registration/Register", pb{req}); grpcwire.CodeOf(err) != grpcwire.Unavailable {
			t.Errorf("Call = %v, want Unavailable", err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		c := grpcwire.NewClient(grpcGoServer(t, &registration{block: true}), 0)
		defer c.Close()
		dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if _, err := c.Call(dctx, "/v1beta1.Registration/Register", pb{req}); grpcwire.CodeOf(err) != grpcwire.DeadlineExceeded {
			t.Errorf("Call = %v, want DeadlineExceeded", err)
		}
	})
	t.Run("answer over the limit", func(t *testing.T) {
		s := grpcwire.NewServer(nil)
		s.HandleUnary("/t.T/Big", func(context.Context, []byte) (grpcwire.Marshaler, error) {
			return pb{&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{{ID: strings.Repeat("x", 2048)}}}}, nil
		})
		c := grpcwire.NewClient(serve(t, s), 1024)
		defer c.Close()
		if _, err := c.Call(ctx, "/t.T/Big", pb{&pluginapi.Empty{}}); grpcwire.CodeOf(err) != grpcwire.ResourceExhausted {
			t.Errorf("Call = %v, want ResourceExhausted", err)
		}
	})
}

// TestOwnClientAndServer: a status without a message, a handler's plain
// error (Unknown) and an empty answer cross intact.
func TestOwnClientAndServer(t *testing.T) {
	s := grpcwire.NewServer(nil)
	s.HandleUnary("/t.T/Plain", func(context.Context, []byte) (grpcwire.Marshaler, error) {
		return nil, errors.New("plain failure")
	})
	s.HandleUnary("/t.T/Empty", func(context.Context, []byte) (grpcwire.Marshaler, error) {
		return pb{&pluginapi.Empty{}}, nil
	})
	s.HandleUnary("/t.T/Code", func(context.Context, []byte) (grpcwire.Marshaler, error) {
		return nil, &grpcwire.Status{Code: grpcwire.NotFound}
	})
	c := grpcwire.NewClient(serve(t, s), 0)
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Call(ctx, "/t.T/Plain", pb{&pluginapi.Empty{}}); grpcwire.CodeOf(err) != grpcwire.Unknown || !strings.Contains(err.Error(), "plain failure") {
		t.Errorf("Plain = %v, want Unknown with the message", err)
	}
	if b, err := c.Call(ctx, "/t.T/Empty", pb{&pluginapi.Empty{}}); err != nil || len(b) != 0 {
		t.Errorf("Empty = %q, %v", b, err)
	}
	if _, err := c.Call(ctx, "/t.T/Code", pb{&pluginapi.Empty{}}); grpcwire.CodeOf(err) != grpcwire.NotFound {
		t.Errorf("Code = %v, want NotFound", err)
	}
}

// TestFlowControl: messages far larger than HTTP/2's initial 64 KiB
// windows cross both ways, on many calls at once over one connection.
func TestFlowControl(t *testing.T) {
	const big = 3 << 20
	s := grpcwire.NewServer(nil)
	s.HandleUnary("/v1beta1.DevicePlugin/GetPreferredAllocation", func(_ context.Context, b []byte) (grpcwire.Marshaler, error) {
		var req pluginapi.PreferredAllocationRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			return nil, err
		}
		ids := req.ContainerRequests[0].AvailableDeviceIDs
		return pb{&pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{{DeviceIDs: ids}}}}, nil
	})
	s.HandleStream("/v1beta1.DevicePlugin/ListAndWatch", func(ctx context.Context, _ []byte, send func(grpcwire.Marshaler) error) error {
		for range 3 {
			if err := send(pb{&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{{ID: strings.Repeat("d", big)}}}}); err != nil {
				return err
			}
		}
		return nil
	})
	c := grpcGoClient(t, serve(t, s), true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.MaxCallRecvMsgSize(16<<20))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if len(m.Devices[0].ID) != big {
			t.Fatalf("message %d: %d bytes, want %d", i, len(m.Devices[0].ID), big)
		}
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("after the last message: %v, want the stream's clean end", err)
	}

	ids := make([]string, 20000)
	for i := range ids {
		ids[i] = fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			resp, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: ids}}})
			if err != nil {
				t.Error(err)
				return
			}
			if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, ids) {
				t.Errorf("%d IDs came back, want the %d sent", len(got), len(ids))
			}
		})
	}
	wg.Wait()
}

// rawConn is a hand-driven HTTP/2 client, for what grpc-go never sends.
type rawConn struct {
	t   *testing.T
	nc  net.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	buf bytes.Buffer
}

func dialRaw(t *testing.T, path string) *rawConn {
	t.Helper()
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	r := &rawConn{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	r.enc = hpack.NewEncoder(&r.buf)
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return r
}

// headers opens stream id with the given fields, ending it.
func (r *rawConn) headers(id uint32, fields ...string) {
	r.buf.Reset()
	for i := 0; i < len(fields); i += 2 {
		r.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.buf.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		r.t.Fatal(err)
	}
}

// next returns the next frame that is not a SETTINGS or WINDOW_UPDATE.
func (r *rawConn) next() http2.Frame {
	r.t.Helper()
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			r.t.Fatalf("reading a frame: %v", err)
		}
		switch f.(type) {
		case *http2.SettingsFrame, *http2.WindowUpdateFrame:
			continue
		}
		return f
	}
}

func TestProtocolEdges(t *testing.T) {
	s := testServer(t, make(chan error, 1), nil)
	path := serve(t, s)

	t.Run("ping", func(t *testing.T) {
		r := dialRaw(t, path)
		data := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
		if err := r.fr.WritePing(false, data); err != nil {
			t.Fatal(err)
		}
		if p, ok := r.next().(*http2.PingFrame); !ok || !p.IsAck() || p.Data != data {
			t.Errorf("answer to a PING: %v", p)
		}
	})
	t.Run("not gRPC", func(t *testing.T) {
		r := dialRaw(t, path)
		r.headers(1, ":method", "GET", ":scheme", "http", ":path", "/", ":authority", "localhost")
		h, ok := r.next().(*http2.MetaHeadersFrame)
		if !ok || h.PseudoValue("status") != "415" || !h.StreamEnded() {
			t.Errorf("answer to a GET: %v", h)
		}
	})
	t.Run("no message", func(t *testing.T) {
		r := dialRaw(t, path)
		r.headers(1, ":method", "POST", ":scheme", "http", ":path", "/v1beta1.DevicePlugin/Allocate", ":authority", "localhost", "content-type", "application/grpc")
		h, ok := r.next().(*http2.MetaHeadersFrame)
		if !ok || h.PseudoValue("status") != "200" || !h.StreamEnded() {
			t.Fatalf("answer: %v", h)
		}
		var status string
		for _, f := range h.RegularFields() {
			if f.Name == "grpc-status" {
				status = f.Value
			}
		}
		if status != "13" {
			t.Errorf("grpc-status %q for a call with no message, want 13 (Internal)", status)
		}
	})
	t.Run("not HTTP/2", func(t *testing.T) {
		nc, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		if n, err := io.Copy(io.Discard, nc); err != nil {
			t.Errorf("the connection ended with %v after %d bytes, want it closed", err, n)
		}
	})
}

// TestRequestBytesAreBounded: one connection may not hold more request
// bytes than the server allows, however many streams carry them; a
// stream reset frees what it held.
func TestRequestBytesAreBounded(t *testing.T) {
	s := testServer(t, make(chan error, 1), nil)
	grpcwire.SetLimits(s, 1<<20, 10<<10)
	r := dialRaw(t, serve(t, s))
	open := func(id uint32) {
		r.buf.Reset()
		for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: "/v1beta1.DevicePlugin/Allocate"}, {Name: ":authority", Value: "x"}, {Name: "content-type", Value: "application/grpc"}} {
			r.enc.WriteField(f)
		}
		if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.buf.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	chunk := make([]byte, 6<<10)
	status := func(h *http2.MetaHeadersFrame) string {
		for _, f := range h.RegularFields() {
			if f.Name == "grpc-status" {
				return f.Value
			}
		}
		return ""
	}
	// Stream 1 holds 6 KiB: stream 3's 6 KiB do not fit beside them.
	open(1)
	if err := r.fr.WriteData(1, false, chunk); err != nil {
		t.Fatal(err)
	}
	open(3)
	if err := r.fr.WriteData(3, true, chunk); err != nil {
		t.Fatal(err)
	}
	h, ok := r.next().(*http2.MetaHeadersFrame)
	if !ok || h.StreamID != 3 || status(h) != "8" {
		t.Fatalf("answer %v (grpc-status %q), want stream 3's ResourceExhausted (8)", h, status(h))
	}
	// Once stream 1 is reset, its bytes are free: stream 5's 6 KiB fit.
	if err := r.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	open(5)
	if err := r.fr.WriteData(5, true, chunk); err != nil {
		t.Fatal(err)
	}
	h, ok = r.next().(*http2.MetaHeadersFrame)
	if !ok || h.StreamID != 5 || status(h) != "" || h.StreamEnded() {
		t.Fatalf("answer %v (grpc-status %q), want stream 5's response headers", h, status(h))
	}
}
