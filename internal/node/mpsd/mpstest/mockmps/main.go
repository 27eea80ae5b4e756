// Command mockmps stands in for nvidia-cuda-mps-control in tests: with -d
// it daemonizes, serving a line protocol on the socket "control" in
// CUDA_MPS_PIPE_DIRECTORY and writing nvidia-cuda-mps-control.pid there;
// without arguments it is the control client, sending each line of stdin
// to the daemon and printing each answer. The daemon records every
// command to control.log in CUDA_MPS_LOG_DIRECTORY and, when
// MOCKMPS_RECORD names a file, there too (it survives the log directory's
// removal; where /etc/mockmps exists, its file record is the default). With
// MOCKMPS_SHM_MARKER set (or the file /etc/mockmps/shm-marker), the daemon writes the file
// /dev/shm/mockmps.<pid> when it starts (showing which /dev/shm it was
// given) and removes it on quit. With MOCKMPS_DEAF set (or /etc/mockmps/deaf), it answers the
// set_default_ commands but keeps its defaults. quit answers, removes the socket, pid
// file and marker, and exits once no client is connected (quit -t N: after
// N seconds at most, dropping them). Its one MPS server exists while
// clients are connected, with limits of its own (get_server_list,
// get_client_list, set_/get_active_thread_percentage,
// set_/get_device_pinned_mem_limit, shutdown_server [-f]).
//
// Installed as mps-client, it is a CUDA client: it connects with the
// limits of its environment, prints the limits it got and runs until
// killed, or fails when its server goes.
//
// Installed as nvidia-smi, it takes `compute-policy -i <uuid>
// --set-timeslice <0-3>` of a GPU- UUID only, and says what it set as the
// real one does.
package main

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	childEnv  = "MOCKMPS_CHILD"
	markerEnv = "MOCKMPS_SHM_MARKER"
	// deafEnv makes the daemon answer the set_default_ commands but keep
	// its limits, as a daemon that did not take them.
	deafEnv = "MOCKMPS_DEAF"
	pidFile = "nvidia-cuda-mps-control.pid"
)

func main() {
	if filepath.Base(os.Args[0]) == "mps-client" {
		if err := mpsClient(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if filepath.Base(os.Args[0]) == "nvidia-smi" {
		if err := smi(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	pipe := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	if pipe == "" {
		pipe = "/tmp/nvidia-mps"
	}
	var err error
	switch {
	case len(os.Args) == 2 && os.Args[1] == "-d" && os.Getenv(childEnv) == "":
		err = daemonize()
	case len(os.Args) == 2 && os.Args[1] == "-d":
		err = serve(pipe)
	case len(os.Args) == 1:
		err = client(pipe)
	default:
		err = fmt.Errorf("usage: %s [-d]", os.Args[0])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// daemonize starts the daemon in its own session and returns once it
// listens, as the real -d returns once the daemon is forked.
func daemonize() error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "-d")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	w.Close()
	buf := make([]byte, 16)
	n, _ := r.Read(buf)
	if string(buf[:n]) != "ok" {
		return fmt.Errorf("daemon did not start: %q", buf[:n])
	}
	return cmd.Process.Release()
}

func serve(pipe string) error {
	ready := os.NewFile(3, "ready")
	sock := filepath.Join(pipe, "control")
	_ = os.Remove(sock) // a killed daemon's
	l, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprint(ready, err)
		return err
	}
	if err := os.WriteFile(filepath.Join(pipe, pidFile), []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
		fmt.Fprint(ready, err)
		return err
	}
	marker := ""
	if switchedOn(markerEnv, "shm-marker") {
		marker = fmt.Sprintf("/dev/shm/mockmps.%d", os.Getpid())
		if err := os.WriteFile(marker, nil, 0o644); err != nil {
			fmt.Fprint(ready, err)
			return err
		}
	}
	fmt.Fprint(ready, "ok")
	ready.Close()
	record("start")
	d := &daemon{thread: "100.0", pinned: map[string]string{}, clients: map[int]net.Conn{}, quit: make(chan struct{})}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go d.session(c)
		}
	}()
	<-d.quit
	l.Close()
	os.Remove(sock)
	os.Remove(filepath.Join(pipe, pidFile))
	if marker != "" {
		os.Remove(marker)
	}
	return nil
}

// daemon is the stand-in's state. Its one MPS server exists while a
// client (an mps-client) is connected; the server's pid is serverPID.
type daemon struct {
	mu sync.Mutex
	// thread and pinned are the defaults (pinned by device) and the
	// server's own limits, which the real daemon keeps apart: a server
	// takes the defaults when it starts.
	thread       string
	pinned       map[string]string
	serverThread string
	serverPinned map[string]string
	clients      map[int]net.Conn
	quitting     bool
	quit         chan struct{}
	quitOnce     sync.Once
}

// serverPID is the fake pid of the daemon's one MPS server.
func serverPID() int { return os.Getpid() + 100000 }

func (d *daemon) exit() { d.quitOnce.Do(func() { close(d.quit) }) }

// session answers one control client, or holds an mps-client's
// connection for as long as it runs.
func (d *daemon) session(c net.Conn) {
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		cmd := strings.TrimSpace(sc.Text())
		record(cmd)
		f := strings.Fields(cmd)
		if len(f) > 0 && f[0] == "client_hello" {
			d.hello(c, f[1:])
			return // the connection is the client's until it or the server ends
		}
		fmt.Fprintln(c, d.answer(f, cmd))
	}
	c.Close()
}

func (d *daemon) answer(f []string, cmd string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	srv := strconv.Itoa(serverPID())
	isServer := func(pid string) bool { return pid == srv && len(d.clients) > 0 }
	switch {
	case len(f) == 0:
		return ""
	case f[0] == "quit":
		d.quitting = true
		if len(f) == 3 && f[1] == "-t" {
			secs, _ := strconv.Atoi(f[2])
			// The real daemon's grace, after which it forces its servers down.
			time.AfterFunc(time.Duration(secs)*time.Second, func() {
				d.mu.Lock()
				d.dropClientsLocked()
				d.mu.Unlock()
				d.exit()
			})
		}
		if len(d.clients) == 0 {
			d.exit()
		}
		return ""
	case f[0] == "get_default_active_thread_percentage":
		return d.thread
	case f[0] == "set_default_active_thread_percentage" && len(f) == 2:
		if !switchedOn(deafEnv, "deaf") {
			d.thread = f[1] + ".0"
		}
		return ""
	case f[0] == "set_default_device_pinned_mem_limit" && len(f) == 3:
		if !switchedOn(deafEnv, "deaf") {
			d.pinned[f[1]] = f[2]
		}
		return ""
	case f[0] == "get_default_device_pinned_mem_limit" && len(f) == 2:
		return d.pinned[f[1]]
	case f[0] == "get_server_list":
		if len(d.clients) == 0 {
			return ""
		}
		return srv
	case f[0] == "get_client_list" && len(f) == 2:
		if !isServer(f[1]) {
			return ""
		}
		var pids []string
		for _, p := range slices.Sorted(maps.Keys(d.clients)) {
			pids = append(pids, strconv.Itoa(p))
		}
		return strings.Join(pids, "\n")
	case f[0] == "set_active_thread_percentage" && len(f) == 3 && isServer(f[1]):
		d.serverThread = f[2] + ".0"
		return ""
	case f[0] == "get_active_thread_percentage" && len(f) == 2 && isServer(f[1]):
		return d.serverThread
	case f[0] == "set_device_pinned_mem_limit" && len(f) == 4 && isServer(f[1]):
		d.serverPinned[f[2]] = f[3]
		return ""
	case f[0] == "get_device_pinned_mem_limit" && len(f) == 3 && isServer(f[1]):
		return d.serverPinned[f[2]]
	case f[0] == "shutdown_server" && (len(f) == 2 || len(f) == 3 && f[2] == "-f") && isServer(f[1]):
		if len(f) == 3 {
			d.dropClientsLocked()
		}
		return ""
	}
	return "error: unknown command " + cmd
}

// dropClientsLocked ends every client's connection, as a server shut down
// by force fails its clients.
func (d *daemon) dropClientsLocked() {
	for pid, c := range d.clients {
		c.Close()
		delete(d.clients, pid)
	}
}

// hello registers an mps-client (pid, and the limits its environment
// asks for, "-" for none) and answers with what it gets: the server's
// limits, narrowed by its own. The server starts with the first client,
// taking the daemon's defaults then.
func (d *daemon) hello(c net.Conn, args []string) {
	d.mu.Lock()
	if d.quitting || len(args) != 3 {
		d.mu.Unlock()
		fmt.Fprintln(c, "error: not accepting clients")
		c.Close()
		return
	}
	pid, _ := strconv.Atoi(args[0])
	if len(d.clients) == 0 {
		d.serverThread, d.serverPinned = d.thread, maps.Clone(d.pinned)
	}
	d.clients[pid] = c
	thread := narrow(d.serverThread, args[1])
	pinned := narrow(strings.TrimSuffix(d.serverPinned["0"], "M"), strings.TrimSuffix(strings.TrimPrefix(args[2], "0="), "M"))
	d.mu.Unlock()
	fmt.Fprintf(c, "server %d threads %s pinnedMiB %s\n", serverPID(), thread, pinned)
	// Held until the client or a forced shutdown closes it.
	_, _ = io.Copy(io.Discard, c)
	d.mu.Lock()
	if d.clients[pid] == c {
		delete(d.clients, pid)
	}
	done := d.quitting && len(d.clients) == 0
	d.mu.Unlock()
	if done {
		d.exit()
	}
}

// narrow is the lower of a server's limit and a client's ("" or "-":
// none), as numbers.
func narrow(server, client string) string {
	s, serr := strconv.ParseFloat(server, 64)
	c, cerr := strconv.ParseFloat(client, 64)
	switch {
	case cerr != nil && serr != nil:
		return "-"
	case cerr != nil:
		return strconv.FormatFloat(s, 'f', -1, 64)
	case serr != nil || c < s:
		return strconv.FormatFloat(c, 'f', -1, 64)
	}
	return strconv.FormatFloat(s, 'f', -1, 64)
}

// switchDir holds the stand-in's switches as files, in the root it runs
// in: the plugin runs the daemon confined, with an environment of its own
// making, which no test variable reaches.
const switchDir = "/etc/mockmps"

// switchedOn says whether env is set, or the file name is in switchDir.
func switchedOn(env, name string) bool {
	if os.Getenv(env) != "" {
		return true
	}
	_, err := os.Stat(filepath.Join(switchDir, name))
	return err == nil
}

func record(cmd string) {
	also := os.Getenv("MOCKMPS_RECORD")
	if _, err := os.Stat(switchDir); also == "" && err == nil {
		also = filepath.Join(switchDir, "record")
	}
	for _, p := range []string{filepath.Join(os.Getenv("CUDA_MPS_LOG_DIRECTORY"), "control.log"), also} {
		if p == "" || p == "control.log" {
			continue
		}
		if f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(f, cmd)
			f.Close()
		}
	}
}

func client(pipe string) error {
	c, err := net.Dial("unix", filepath.Join(pipe, "control"))
	if err != nil {
		return fmt.Errorf("Cannot find MPS control daemon process: %w", err)
	}
	defer c.Close()
	in, answers := bufio.NewScanner(os.Stdin), bufio.NewScanner(c)
	for in.Scan() {
		if _, err := fmt.Fprintln(c, in.Text()); err != nil {
			return err
		}
		if !answers.Scan() {
			// quit may end the daemon before its empty answer leaves, as
			// the real one does; the real client exits 0 then.
			if strings.HasPrefix(in.Text(), "quit") && answers.Err() == nil {
				return nil
			}
			return fmt.Errorf("daemon closed the connection")
		}
		if a := answers.Text(); strings.HasPrefix(a, "error") {
			return fmt.Errorf("%s", a)
		} else if a != "" {
			fmt.Println(a)
		}
	}
	return nil
}

// mpsClient is the stand-in CUDA client: it connects to the daemon of
// CUDA_MPS_PIPE_DIRECTORY (MPS's default without), asks for the limits of
// its environment, prints what it got, and runs until killed or until its
// server goes (then it fails, as a CUDA client whose server died does).
func mpsClient() error {
	pipe := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	if pipe == "" {
		pipe = "/tmp/nvidia-mps"
	}
	c, err := net.Dial("unix", filepath.Join(pipe, "control"))
	if err != nil {
		return fmt.Errorf("mps-client: no MPS control daemon: %w", err)
	}
	defer c.Close()
	ask := func(k string) string { return cmpOr(os.Getenv(k), "-") }
	fmt.Fprintf(c, "client_hello %d %s %s\n", os.Getpid(), ask("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), ask("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
	r := bufio.NewReader(c)
	got, err := r.ReadString('\n')
	if err != nil || strings.HasPrefix(got, "error") {
		return fmt.Errorf("mps-client: refused: %s %v", strings.TrimSpace(got), err)
	}
	fmt.Print(got)
	_, _ = io.Copy(io.Discard, r)
	return fmt.Errorf("mps-client: the MPS server ended")
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// smi is the nvidia-smi stand-in.
func smi(args []string) error {
	if len(args) != 5 || args[0] != "compute-policy" || args[1] != "-i" || args[3] != "--set-timeslice" || len(args[4]) != 1 || args[4] < "0" || args[4] > "3" {
		return fmt.Errorf("mock nvidia-smi: takes compute-policy -i <uuid> --set-timeslice <0-3>, got %q", args)
	}
	if !strings.HasPrefix(args[2], "GPU-") {
		return fmt.Errorf("mock nvidia-smi: no GPU %q (a whole GPU's UUID)", args[2])
	}
	fmt.Printf("Set compute time slice to %s for GPU %s (mock).\n", args[4], args[2])
	return nil
}
