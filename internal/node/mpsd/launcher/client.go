package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ErrNotAnswering: nothing answers on the launcher's socket.
var ErrNotAnswering = errors.New("does not answer")

// Start asks the launcher at socket to start the control daemon of the
// GPU with uuid, and waits for its answer until ctx ends.
func Start(ctx context.Context, socket, uuid string) error {
	resp, err := request(ctx, socket, Request{GPU: uuid})
	if err != nil {
		return err
	}
	if !resp.OK {
		msg := "the MPS launcher did not start GPU " + uuid + "'s control daemon: " + resp.Error
		if resp.Output != "" {
			msg += ": " + resp.Output
		}
		return errors.New(msg)
	}
	return nil
}

// Servers asks the launcher at socket for the MPS servers running on the
// GPU with uuid, in the host's process table.
func Servers(ctx context.Context, socket, uuid string) ([]int, error) {
	resp, err := request(ctx, socket, Request{GPU: uuid, Servers: true})
	if err != nil {
		return nil, err
	}
	if !resp.OK {
		return nil, fmt.Errorf("the MPS launcher did not list GPU %s's MPS servers: %s", uuid, resp.Error)
	}
	return resp.Servers, nil
}

// request sends one request and reads the answer, until ctx ends.
func request(ctx context.Context, socket string, req Request) (Response, error) {
	if err := ValidGPU(req.GPU); err != nil {
		return Response{}, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return Response{}, fmt.Errorf("the MPS launcher at %s %w (%w); is the chart's mps-launcher DaemonSet (gpu-device-plugin mps-launcher) running on this node?", socket, ErrNotAnswering, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return Response{}, fmt.Errorf("asking the MPS launcher at %s: %w", socket, err)
	}
	var resp Response
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		return Response{}, fmt.Errorf("the MPS launcher at %s gave no answer for GPU %s: %w", socket, req.GPU, err)
	}
	return resp, nil
}

// HelperCommand is the hidden subcommand of our own executable that runs
// Main: `mps-launch <socket> <uuid>`. The plugin's mpsd.Manager runs each
// daemon start as a command; this is that command when a launcher runs
// the daemons.
const HelperCommand = "mps-launch"

// Command is the command that asks the launcher at socket to start the
// daemon of the GPU env names (CUDA_VISIBLE_DEVICES), through self (our
// own executable), in place of running the control program with -d.
func Command(ctx context.Context, self, socket string, env []string) (*exec.Cmd, error) {
	uuid := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "CUDA_VISIBLE_DEVICES="); ok {
			uuid = v
		}
	}
	if err := ValidGPU(uuid); err != nil {
		return nil, fmt.Errorf("MPS launcher: CUDA_VISIBLE_DEVICES: %w", err)
	}
	return exec.CommandContext(ctx, self, HelperCommand, socket, uuid), nil
}

// Main is HelperCommand: args are the socket and the GPU's UUID.
func Main(ctx context.Context, args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("%s: want <socket> <GPU UUID>; the plugin runs it to ask the MPS launcher for a daemon", HelperCommand)
	}
	return Start(ctx, args[0], args[1])
}

// RunIfHelper, when this process was started as HelperCommand, runs Main
// and exits, 0 or 1 with its error; it returns otherwise. Programs without
// the CLI's hidden command (the DRA executable) call it first.
func RunIfHelper() {
	if len(os.Args) < 2 || os.Args[1] != HelperCommand {
		return
	}
	if err := Main(context.Background(), os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, filepath.Base(os.Args[0])+":", err)
		os.Exit(1)
	}
	os.Exit(0)
}
