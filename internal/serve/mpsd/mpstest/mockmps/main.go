// Command mockmps stands in for nvidia-cuda-mps-control in tests: with -d
// it daemonizes, serving a line protocol on the socket "control" in
// CUDA_MPS_PIPE_DIRECTORY and writing nvidia-cuda-mps-control.pid there;
// without arguments it is the control client, sending each line of stdin
// to the daemon and printing each answer. The daemon records every
// command to control.log in CUDA_MPS_LOG_DIRECTORY and, when
// MOCKMPS_RECORD names a file, there too (it survives the log directory's
// removal). With MOCKMPS_SHM_MARKER set, the daemon writes the file
// /dev/shm/mockmps.<pid> when it starts (showing which /dev/shm it was
// given) and removes it on quit. quit answers, removes the socket, pid
// file and marker, and exits.
//
// Installed as nvidia-smi, it takes `compute-policy -i <uuid>
// --set-timeslice <0-3>` of a GPU- UUID only, and says what it set as the
// real one does.
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

const (
	childEnv  = "MOCKMPS_CHILD"
	markerEnv = "MOCKMPS_SHM_MARKER"
	pidFile   = "nvidia-cuda-mps-control.pid"
)

func main() {
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
	if os.Getenv(markerEnv) != "" {
		marker = fmt.Sprintf("/dev/shm/mockmps.%d", os.Getpid())
		if err := os.WriteFile(marker, nil, 0o644); err != nil {
			fmt.Fprint(ready, err)
			return err
		}
	}
	fmt.Fprint(ready, "ok")
	ready.Close()
	record("start")
	thread := "100.0" // the default, as the real daemon answers it
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		if quit := session(c, &thread); quit {
			l.Close()
			os.Remove(sock)
			os.Remove(filepath.Join(pipe, pidFile))
			if marker != "" {
				os.Remove(marker)
			}
			return nil
		}
	}
}

// session answers one client; true when it said quit. thread is the
// daemon's default active thread percentage.
func session(c net.Conn, thread *string) bool {
	defer c.Close()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		cmd := strings.TrimSpace(sc.Text())
		record(cmd)
		f := strings.Fields(cmd)
		answer := ""
		switch {
		case len(f) == 0:
		case f[0] == "quit":
			fmt.Fprintln(c, answer)
			return true
		case f[0] == "get_default_active_thread_percentage":
			answer = *thread
		case f[0] == "set_default_active_thread_percentage" && len(f) == 2:
			*thread = f[1] + ".0"
		case f[0] == "set_default_device_pinned_mem_limit" && len(f) == 3,
			f[0] == "get_server_list", f[0] == "get_client_list" && len(f) == 2:
		default:
			answer = "error: unknown command " + cmd
		}
		fmt.Fprintln(c, answer)
	}
	return false
}

func record(cmd string) {
	for _, p := range []string{filepath.Join(os.Getenv("CUDA_MPS_LOG_DIRECTORY"), "control.log"), os.Getenv("MOCKMPS_RECORD")} {
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
