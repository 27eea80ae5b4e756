package grpcwire

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
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

const (
	// recvWindow is the flow-control window we grant each stream and the
	// connection: a request is read whole before its handler runs, and
	// every DATA frame is credited back as it arrives.
	recvWindow = 1 << 20
	// maxStreams is how many calls a client may have open at once.
	maxStreams = 1000
	// prefaceTimeout bounds how long a new connection may take to say it
	// speaks HTTP/2.
	prefaceTimeout = 10 * time.Second
	// defaultMaxBuffered bounds the request bytes one connection may have
	// read and not yet handed to a handler, over all its open streams.
	defaultMaxBuffered = 64 << 20
)

// Server answers gRPC calls on the listeners it serves. Register every
// method before Serve.
//
// It is an HTTP/2 server of its own, cut to what gRPC clients send:
// net/http's server hands each frame of a response from the handler to
// its connection goroutine and waits, three times for a unary answer,
// which doubled Allocate's round trip against grpc-go's server. Here a
// handler writes its response headers, message and trailers at once, in
// one write to the socket. Frames are parsed and built by x/net's Framer
// and hpack.
type Server struct {
	methods     map[string]method
	maxRecv     int
	maxBuffered int
	log         *slog.Logger

	mu      sync.Mutex
	stopped bool
	lns     map[net.Listener]struct{}
	conns   map[*conn]struct{}
}

// NewServer returns a server with no methods. A client that breaks the
// protocol is logged at debug level and disconnected.
func NewServer(log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		methods:     map[string]method{},
		maxRecv:     DefaultMaxMessage,
		maxBuffered: defaultMaxBuffered,
		log:         log,
		lns:         map[net.Listener]struct{}{},
		conns:       map[*conn]struct{}{},
	}
}

// HandleUnary answers calls of name (/package.Service/Method) with f.
func (s *Server) HandleUnary(name string, f UnaryFunc) { s.methods[name] = method{unary: f} }

// HandleStream answers server-streaming calls of name with f.
func (s *Server) HandleStream(name string, f StreamFunc) { s.methods[name] = method{stream: f} }

// Serve answers calls on ln until Stop, and closes ln. It returns nil
// after Stop, else the error that ended it.
func (s *Server) Serve(ln net.Listener) error {
	defer ln.Close()
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			stopped := s.stopped
			s.mu.Unlock()
			if stopped {
				return nil
			}
			return fmt.Errorf("accepting a connection: %w", err)
		}
		c := newConn(s, nc)
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			nc.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		go c.serve()
	}
}

// Stop closes the listeners and every connection at once; calls in
// flight see their context end, and clients see the connection go.
func (s *Server) Stop() {
	s.mu.Lock()
	s.stopped = true
	lns, conns := s.lns, s.conns
	s.lns, s.conns = map[net.Listener]struct{}{}, map[*conn]struct{}{}
	s.mu.Unlock()
	for ln := range lns {
		ln.Close()
	}
	for c := range conns {
		c.close()
	}
}

// conn is one client connection. One goroutine reads frames; each call
// runs in a goroutine of its own and writes its own frames.
type conn struct {
	s      *Server
	nc     net.Conn
	br     *bufio.Reader
	ctx    context.Context
	cancel context.CancelFunc

	// wmu guards everything that writes: the framer's write side, the
	// buffered writer, the header encoder and the peer's frame size.
	wmu      sync.Mutex
	bw       *bufio.Writer
	fr       *http2.Framer
	enc      *hpack.Encoder
	encBuf   bytes.Buffer
	maxFrame int

	// fmu guards the send windows and the open streams; fcond wakes
	// writers waiting for window.
	fmu     sync.Mutex
	fcond   *sync.Cond
	sendWin int64 // the connection's
	initWin int64 // a new stream's, as the peer's settings say
	streams map[uint32]*stream
	closed  bool

	// cmu guards control frames the reading goroutine queued (window
	// updates, PING and SETTINGS acknowledgements, resets): it must never
	// wait for the socket, or a client that stops reading until we read
	// its data would deadlock with us. kick wakes controlWriter.
	cmu     sync.Mutex
	pending []func() error
	kick    chan struct{}

	// Only the reading goroutine uses these.
	lastID   uint32
	unacked  uint32 // received and not yet credited back, connection-wide
	buffered int    // request bytes held for streams not yet dispatched

	closeOnce sync.Once
}

// stream is one call.
type stream struct {
	id     uint32
	ctx    context.Context
	cancel context.CancelFunc
	// Under conn.fmu.
	win  int64
	done bool // reset by the client, or finished

	// Only the reading goroutine uses these, until dispatch.
	method, path, contentType, timeout string
	body                               []byte
	unacked                            uint32
	tooBig, dispatched                 bool
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, br: bufio.NewReaderSize(nc, 16<<10), bw: bufio.NewWriterSize(nc, 16<<10),
		maxFrame: 16 << 10, sendWin: 65535, initWin: 65535, streams: map[uint32]*stream{}, kick: make(chan struct{}, 1)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.fcond = sync.NewCond(&c.fmu)
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = 1 << 20
	c.fr.SetMaxReadFrameSize(16 << 10)
	c.enc = hpack.NewEncoder(&c.encBuf)
	return c
}

var errStreamDone = errors.New("stream reset by the client or finished")

func (c *conn) serve() {
	defer c.close()
	c.nc.SetReadDeadline(time.Now().Add(prefaceTimeout))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.br, preface); err != nil || string(preface) != http2.ClientPreface {
		c.s.log.Debug("gRPC: a client that does not speak HTTP/2 with prior knowledge", "err", err)
		return
	}
	c.nc.SetReadDeadline(time.Time{})
	err := c.write(func() error {
		if err := c.fr.WriteSettings(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: maxStreams},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: recvWindow},
		); err != nil {
			return err
		}
		return c.fr.WriteWindowUpdate(0, recvWindow-65535)
	})
	if err != nil {
		return
	}
	go c.controlWriter()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.s.log.Debug("gRPC: stream error", "stream", se.StreamID, "err", err)
				c.fmu.Lock()
				st := c.streams[se.StreamID]
				c.fmu.Unlock()
				if st != nil {
					c.release(st)
				}
				c.resetStream(se.StreamID, se.Code)
				continue
			}
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				c.goAway(http2.ErrCode(ce), err)
			}
			return
		}
		if err := c.handle(f); err != nil {
			c.goAway(http2.ErrCodeProtocol, err)
			return
		}
	}
}

// handle acts on one frame; an error is the connection's end.
func (c *conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if err := f.ForeachSetting(c.setting); err != nil {
			return err
		}
		c.control(c.fr.WriteSettingsAck)
	case *http2.PingFrame:
		if !f.IsAck() {
			data := f.Data
			c.control(func() error { return c.fr.WritePing(true, data) })
		}
	case *http2.WindowUpdateFrame:
		c.fmu.Lock()
		if f.StreamID == 0 {
			c.sendWin += int64(f.Increment)
		} else if st := c.streams[f.StreamID]; st != nil {
			st.win += int64(f.Increment)
		}
		c.fcond.Broadcast()
		c.fmu.Unlock()
	case *http2.MetaHeadersFrame:
		return c.onHeaders(f)
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.RSTStreamFrame:
		c.fmu.Lock()
		st := c.streams[f.StreamID]
		if st != nil {
			st.done = true
			delete(c.streams, f.StreamID)
			c.fcond.Broadcast()
		}
		c.fmu.Unlock()
		if st != nil {
			c.release(st)
			st.cancel()
		}
	}
	// GOAWAY: the client opens no more streams, and those open finish.
	// PRIORITY and frame types we do not know: nothing to do.
	return nil
}

func (c *conn) setting(s http2.Setting) error {
	if err := s.Valid(); err != nil {
		return err
	}
	switch s.ID {
	case http2.SettingInitialWindowSize:
		c.fmu.Lock()
		delta := int64(s.Val) - c.initWin
		c.initWin = int64(s.Val)
		for _, st := range c.streams {
			st.win += delta
		}
		c.fcond.Broadcast()
		c.fmu.Unlock()
	// These two belong to the write side: changed there, in order with
	// the SETTINGS acknowledgement, so the reader never waits for wmu.
	case http2.SettingMaxFrameSize:
		v := int(s.Val)
		c.control(func() error { c.maxFrame = v; return nil })
	case http2.SettingHeaderTableSize:
		v := s.Val
		c.control(func() error { c.enc.SetMaxDynamicTableSizeLimit(v); return nil })
	}
	return nil
}

func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	c.fmu.Lock()
	st := c.streams[f.StreamID]
	n := len(c.streams)
	c.fmu.Unlock()
	if st != nil {
		// Trailers from the client: gRPC clients send none, but they
		// would end the request.
		if f.StreamEnded() {
			c.dispatch(st)
		}
		return nil
	}
	if f.StreamID%2 == 0 || f.StreamID <= c.lastID {
		return fmt.Errorf("headers on stream %d, which the client cannot open (last opened %d)", f.StreamID, c.lastID)
	}
	c.lastID = f.StreamID
	if n >= maxStreams {
		c.resetStream(f.StreamID, http2.ErrCodeRefusedStream)
		return nil
	}
	st = &stream{id: f.StreamID}
	for _, hf := range f.Fields {
		switch hf.Name {
		case ":method":
			st.method = hf.Value
		case ":path":
			st.path = hf.Value
		case "content-type":
			st.contentType = hf.Value
		case "grpc-timeout":
			st.timeout = hf.Value
		}
	}
	st.ctx, st.cancel = context.WithCancel(c.ctx)
	c.fmu.Lock()
	st.win = c.initWin
	c.streams[st.id] = st
	c.fmu.Unlock()
	if f.StreamEnded() {
		c.dispatch(st)
	}
	return nil
}

func (c *conn) onData(f *http2.DataFrame) error {
	c.fmu.Lock()
	st := c.streams[f.StreamID]
	c.fmu.Unlock()
	// Credit the bytes back, padding included, once a quarter of a window
	// has come (a request is bounded by maxRecv, not by flow control): a
	// small call's request needs no update at all.
	if n := f.Header().Length; n > 0 {
		c.unacked += n
		if c.unacked >= recvWindow/4 {
			k := c.unacked
			c.unacked = 0
			c.control(func() error { return c.fr.WriteWindowUpdate(0, k) })
		}
		if st != nil && !f.StreamEnded() {
			st.unacked += n
			if st.unacked >= recvWindow/4 {
				id, k := st.id, st.unacked
				st.unacked = 0
				c.control(func() error { return c.fr.WriteWindowUpdate(id, k) })
			}
		}
	}
	if st == nil || st.dispatched {
		return nil // a stream the client reset, or data after its end
	}
	if d := f.Data(); len(st.body)+len(d) > c.s.maxRecv+frameHeader || c.buffered+len(d) > c.s.maxBuffered {
		c.buffered -= len(st.body)
		st.tooBig, st.body = true, nil
	} else if !st.tooBig {
		st.body = append(st.body, d...) // d is the framer's until the next read
		c.buffered += len(d)
	}
	if f.StreamEnded() {
		c.dispatch(st)
	}
	return nil
}

// release forgets the request bytes of a stream that ends before its
// handler runs. Only the reading goroutine calls it.
func (c *conn) release(st *stream) {
	if !st.dispatched {
		c.buffered -= len(st.body)
		st.body = nil
	}
}

func (c *conn) dispatch(st *stream) {
	if st.dispatched {
		return
	}
	st.dispatched = true
	c.buffered -= len(st.body)
	go c.run(st)
}

// run answers one call and ends its stream.
func (c *conn) run(st *stream) {
	defer func() {
		c.fmu.Lock()
		st.done = true
		delete(c.streams, st.id)
		c.fmu.Unlock()
		st.cancel()
	}()
	defer func() {
		if p := recover(); p != nil {
			c.s.log.Error("gRPC handler panicked", "method", st.path, "panic", p)
			c.resetStream(st.id, http2.ErrCodeInternal)
		}
	}()
	if st.method != "POST" || !isGRPC(st.contentType) {
		c.send(st, []hpack.HeaderField{{Name: ":status", Value: "415"}}, nil, true)
		return
	}
	m, ok := c.s.methods[st.path]
	if !ok {
		c.finish(st, false, Errorf(Unimplemented, "unknown method %s", st.path))
		return
	}
	ctx := st.ctx
	if st.timeout != "" {
		d, err := parseTimeout(st.timeout)
		if err != nil {
			c.finish(st, false, Errorf(Internal, "%v", err))
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	if st.tooBig {
		c.finish(st, false, Errorf(ResourceExhausted, "request over the %d-byte limit, or over %d bytes of requests read at once on one connection", c.s.maxRecv, c.s.maxBuffered))
		return
	}
	req, err := readMessage(bytes.NewReader(st.body), c.s.maxRecv)
	if errors.Is(err, io.EOF) {
		err = Errorf(Internal, "%s: the call carried no request message", st.path)
	}
	if err != nil {
		c.finish(st, false, err)
		return
	}
	if m.unary != nil {
		resp, err := m.unary(ctx, req)
		if err != nil {
			c.finish(st, false, err)
			return
		}
		// Headers, message and trailers in one write.
		c.send(st, okHeaders, Frame(resp), false, trailers(nil)...)
		return
	}
	sent := false
	err = m.stream(ctx, req, func(msg Marshaler) error {
		var h []hpack.HeaderField
		if !sent {
			h, sent = okHeaders, true
		}
		return c.send(st, h, Frame(msg), false)
	})
	c.finish(st, sent, err)
}

var okHeaders = []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"}}

// trailers are the status fields for err.
func trailers(err error) []hpack.HeaderField {
	code := CodeOf(err)
	f := []hpack.HeaderField{{Name: "grpc-status", Value: strconv.FormatUint(uint64(code), 10)}}
	if err != nil {
		msg := err.Error()
		var st *Status
		if errors.As(err, &st) {
			msg = st.Message
		}
		if msg != "" {
			f = append(f, hpack.HeaderField{Name: "grpc-message", Value: encodeMessage(msg)})
		}
	}
	return f
}

// finish ends a call with err's status: in trailers after a response has
// begun, else alone with the response headers (gRPC's trailers-only).
func (c *conn) finish(st *stream, begun bool, err error) {
	if begun {
		c.send(st, nil, nil, true, trailers(err)...)
		return
	}
	c.send(st, append(okHeaders[:len(okHeaders):len(okHeaders)], trailers(err)...), nil, true)
}

// send writes headers (when given), data as the send windows allow, and
// then trailers or, with end, the end of the stream. It flushes once at
// the end, and before each wait for window.
func (c *conn) send(st *stream, headers []hpack.HeaderField, data []byte, end bool, trailer ...hpack.HeaderField) error {
	for {
		n := 0
		if len(data) > 0 {
			var err error
			if n, err = c.window(st, len(data)); err != nil {
				return err
			}
		}
		last := n == len(data)
		err := c.write(func() error {
			c.fmu.Lock()
			done := st.done
			c.fmu.Unlock()
			if done {
				return errStreamDone
			}
			if headers != nil {
				if err := c.writeHeaderBlock(st.id, headers, end && len(data) == 0); err != nil {
					return err
				}
				headers = nil
			}
			for chunk := data[:n]; len(chunk) > 0; {
				k := min(len(chunk), c.maxFrame)
				if err := c.fr.WriteData(st.id, false, chunk[:k]); err != nil {
					return err
				}
				chunk = chunk[k:]
			}
			if !last {
				return nil
			}
			if len(trailer) > 0 {
				return c.writeHeaderBlock(st.id, trailer, true)
			}
			if end && len(data) > 0 {
				return c.fr.WriteData(st.id, true, nil)
			}
			return nil
		})
		data = data[n:]
		if err != nil || last {
			return err
		}
	}
}

// window takes up to want bytes of send window for st, waiting until
// some is free; it fails once the stream or connection is gone.
func (c *conn) window(st *stream, want int) (int, error) {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	for {
		// Whatever ends a stream sets done or closed and broadcasts.
		if c.closed || st.done {
			return 0, errStreamDone
		}
		if avail := min(c.sendWin, st.win); avail > 0 {
			n := min(int64(want), avail)
			c.sendWin -= n
			st.win -= n
			return int(n), nil
		}
		c.fcond.Wait()
	}
}

// writeHeaderBlock encodes fields and writes them as HEADERS and, past
// the peer's frame size, CONTINUATION frames. Under wmu.
func (c *conn) writeHeaderBlock(id uint32, fields []hpack.HeaderField, end bool) error {
	c.encBuf.Reset()
	for _, f := range fields {
		if err := c.enc.WriteField(f); err != nil {
			return err
		}
	}
	block := c.encBuf.Bytes()
	first := block[:min(len(block), c.maxFrame)]
	block = block[len(first):]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: end, EndHeaders: len(block) == 0}); err != nil {
		return err
	}
	for len(block) > 0 {
		k := min(len(block), c.maxFrame)
		if err := c.fr.WriteContinuation(id, k == len(block), block[:k]); err != nil {
			return err
		}
		block = block[k:]
	}
	return nil
}

// write runs fn with the write side held, after any control frames
// queued, and flushes. A failed write ends the connection: the peer's
// view of it is lost.
func (c *conn) write(fn func() error) error {
	c.wmu.Lock()
	err := c.writeControl()
	if err == nil {
		err = fn()
	}
	if err == nil || errors.Is(err, errStreamDone) {
		if ferr := c.bw.Flush(); ferr != nil {
			err = ferr
		}
	}
	c.wmu.Unlock()
	if err != nil && !errors.Is(err, errStreamDone) {
		c.close()
	}
	return err
}

func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.fmu.Lock()
	st := c.streams[id]
	if st != nil {
		st.done = true
		delete(c.streams, id)
		c.fcond.Broadcast()
	}
	c.fmu.Unlock()
	if st != nil {
		st.cancel()
	}
	c.control(func() error { return c.fr.WriteRSTStream(id, code) })
}

// goAway tells the client why the connection ends, waiting at most a
// second: the reading goroutine closes it next.
func (c *conn) goAway(code http2.ErrCode, why error) {
	c.s.log.Debug("gRPC: closing a connection that broke the protocol", "err", why)
	c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	_ = c.write(func() error { return c.fr.WriteGoAway(c.lastID, code, nil) })
}

// control queues a control frame for controlWriter.
func (c *conn) control(fn func() error) {
	c.cmu.Lock()
	c.pending = append(c.pending, fn)
	c.cmu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// controlWriter writes queued control frames until the connection ends.
func (c *conn) controlWriter() {
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.kick:
		}
		if c.write(func() error { return nil }) != nil {
			return
		}
	}
}

// writeControl writes the queued control frames. Under wmu.
func (c *conn) writeControl() error {
	c.cmu.Lock()
	p := c.pending
	c.pending = nil
	c.cmu.Unlock()
	for _, fn := range p {
		if err := fn(); err != nil {
			return err
		}
	}
	return nil
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		c.fmu.Lock()
		c.closed = true
		c.fcond.Broadcast()
		c.fmu.Unlock()
		c.cancel()
		c.nc.Close()
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
}
