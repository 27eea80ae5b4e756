// Command imexstub stands in for NVIDIA's nvidia-imex and nvidia-imex-ctl
// where no GB200 is, written from NVIDIA's documented behaviour, not its
// code. Which one it is comes from the name it runs under (the lane links
// both names to it):
//
//   - nvidia-imex -c config.cfg: reads config.cfg (KEY=value) and the peer
//     list IMEX_NODE_CONFIG_FILE names (one address a line), serves peers
//     on SERVER_IP_ADDRESS:SERVER_PORT, dials every other peer on the same
//     port and keeps dialling, and answers the command port
//     (IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT when IMEX_CMD_ENABLED=1).
//     It is ready once a connection to every peer is up; a peer that
//     restarts drops its connections, so the others are not ready until it
//     is back. It writes IMEX_DAEMON_PID_FILE and ends on SIGTERM.
//   - nvidia-imex-ctl -q [-c config.cfg]: asks the daemon and prints READY
//     or UNAVAILABLE, as the real one does; -N prints each peer and
//     whether it is connected.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
)

func main() {
	var err error
	if strings.Contains(filepath.Base(os.Args[0]), "ctl") {
		err = ctl(os.Args[1:])
	} else {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		err = daemon(ctx, os.Args[1:])
		stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, filepath.Base(os.Args[0])+":", err)
		os.Exit(1)
	}
}

type config struct {
	bind       string
	serverPort int
	cmdAddr    string
	peers      []string
	pidFile    string
}

func readConfig(path string) (config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return config{}, err
	}
	kv, err := computedomain.ParseConfigFile(string(b))
	if err != nil {
		return config{}, fmt.Errorf("%s: %w", path, err)
	}
	num := func(k string, def int) (int, error) {
		if kv[k] == "" {
			return def, nil
		}
		v, err := strconv.Atoi(kv[k])
		if err != nil {
			return 0, fmt.Errorf("%s: %s=%q is not a number", path, k, kv[k])
		}
		return v, nil
	}
	c := config{bind: kv["SERVER_IP_ADDRESS"], pidFile: kv["IMEX_DAEMON_PID_FILE"]}
	if c.bind == "" {
		c.bind = "0.0.0.0"
	}
	if c.serverPort, err = num("SERVER_PORT", computedomain.DefaultServerPort); err != nil {
		return c, err
	}
	cmdPort, err := num("IMEX_CMD_PORT", computedomain.DefaultCmdPort)
	if err != nil {
		return c, err
	}
	cmdIP := kv["IMEX_CMD_BIND_INTERFACE_IP"]
	if cmdIP == "" {
		cmdIP = "127.0.0.1"
	}
	c.cmdAddr = net.JoinHostPort(cmdIP, strconv.Itoa(cmdPort))
	if kv["IMEX_NODE_CONFIG_FILE"] == "" {
		return c, fmt.Errorf("%s: IMEX_NODE_CONFIG_FILE is not set", path)
	}
	nodes, err := os.ReadFile(kv["IMEX_NODE_CONFIG_FILE"])
	if err != nil {
		return c, err
	}
	for _, l := range strings.Split(string(nodes), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			c.peers = append(c.peers, l)
		}
	}
	return c, nil
}

// peerState is which peers have a live connection, owned by its mutex.
type peerState struct {
	mu   sync.Mutex
	up   map[string]bool
	self string
	all  []string
}

func (p *peerState) set(peer string, up bool) {
	p.mu.Lock()
	p.up[peer] = up
	p.mu.Unlock()
}

func (p *peerState) ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.all {
		if a != p.self && !p.up[a] {
			return false
		}
	}
	return true
}

func (p *peerState) table() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, a := range p.all {
		st := "UNAVAILABLE"
		if a == p.self || p.up[a] {
			st = "READY"
		}
		fmt.Fprintf(&b, "%s %s\n", a, st)
	}
	return b.String()
}

func daemon(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("nvidia-imex", flag.ContinueOnError)
	cfgPath := fs.String("c", "/etc/nvidia-imex/config.cfg", "config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := readConfig(*cfgPath)
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	srv, err := lc.Listen(ctx, "tcp", net.JoinHostPort(c.bind, strconv.Itoa(c.serverPort)))
	if err != nil {
		return fmt.Errorf("SERVER_PORT: %w", err)
	}
	cmd, err := lc.Listen(ctx, "tcp", c.cmdAddr)
	if err != nil {
		srv.Close()
		return fmt.Errorf("IMEX_CMD_PORT: %w", err)
	}
	if c.pidFile != "" {
		if err := os.WriteFile(c.pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			return err
		}
	}
	ps := &peerState{up: map[string]bool{}, self: c.bind, all: c.peers}
	var wg sync.WaitGroup
	wg.Go(func() { servePeers(ctx, srv) })
	wg.Go(func() { serveCmd(ctx, cmd, ps) })
	for _, p := range c.peers {
		if p != c.bind {
			wg.Go(func() { dial(ctx, ps, p, c.serverPort) })
		}
	}
	<-ctx.Done()
	srv.Close()
	cmd.Close()
	wg.Wait()
	return nil
}

// servePeers accepts peers and holds their connections until either side
// ends: the peer sees EOF when this daemon stops.
func servePeers(ctx context.Context, l net.Listener) {
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		<-ctx.Done()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		go func() {
			// Peers send nothing; a read returns when the peer goes.
			_, _ = c.Read(make([]byte, 1))
			c.Close()
		}()
	}
}

// dial keeps one connection to peer up, marking it down while it is not.
func dial(ctx context.Context, ps *peerState, peer string, port int) {
	d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(ps.self)}}
	for ctx.Err() == nil {
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(peer, strconv.Itoa(port)))
		if err == nil {
			ps.set(peer, true)
			stop := context.AfterFunc(ctx, func() { c.Close() })
			_, _ = c.Read(make([]byte, 1)) // returns when the peer goes
			stop()
			c.Close()
			ps.set(peer, false)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond): // the redial interval
		}
	}
}

func serveCmd(ctx context.Context, l net.Listener, ps *peerState) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			switch strings.TrimSpace(line) {
			case "q":
				if ps.ready() {
					fmt.Fprintln(c, "READY")
				} else {
					fmt.Fprintln(c, "UNAVAILABLE")
				}
			case "N":
				fmt.Fprint(c, ps.table())
			default:
				fmt.Fprintln(c, "ERROR unknown command")
			}
		}()
	}
}

func ctl(args []string) error {
	fs := flag.NewFlagSet("nvidia-imex-ctl", flag.ContinueOnError)
	q := fs.Bool("q", false, "print READY or UNAVAILABLE")
	n := fs.Bool("N", false, "print the nodes' status")
	cfgPath := fs.String("c", "/etc/nvidia-imex/config.cfg", "config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := readConfig(*cfgPath)
	if err != nil {
		return err
	}
	verb := ""
	switch {
	case *q:
		verb = "q"
	case *n:
		verb = "N"
	default:
		return errors.New("give -q or -N")
	}
	conn, err := net.DialTimeout("tcp", c.cmdAddr, 2*time.Second)
	if err != nil {
		if *q { // no daemon: not ready, as the real one says
			fmt.Println("UNAVAILABLE")
			return nil
		}
		return err
	}
	defer conn.Close()
	fmt.Fprintln(conn, verb)
	sc := bufio.NewScanner(conn)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if slices.Contains(lines, "ERROR unknown command") {
		return errors.New("the daemon did not understand " + verb)
	}
	fmt.Println(strings.Join(lines, "\n"))
	return nil
}
