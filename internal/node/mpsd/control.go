package mpsd

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// control sends one command through the control client, as
// `echo cmd | nvidia-cuda-mps-control` does, and returns its answer.
func (m *Manager) control(g GPU, command string) (string, error) {
	// Not the daemon's ctx: quit must still go out once it has ended.
	ctx, cancel := context.WithTimeout(context.Background(), m.o.CommandTimeout)
	defer cancel()
	cmd, err := m.command(ctx, g)
	if err != nil {
		return "", err
	}
	cmd.Stdin = strings.NewReader(command + "\n")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("MPS control %q: %w: %s", command, err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

func (m *Manager) command(ctx context.Context, g GPU, args ...string) (*exec.Cmd, error) {
	dirs, env := m.dirs(g.UUID), []string{"CUDA_VISIBLE_DEVICES=" + g.UUID}
	if m.o.Command != nil {
		return m.o.Command(ctx, dirs, env, args...)
	}
	cmd := exec.CommandContext(ctx, m.o.Binary, args...)
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") || strings.HasPrefix(kv, "CUDA_MPS_")
	}), append(env,
		"CUDA_MPS_PIPE_DIRECTORY="+dirs.Pipe,
		"CUDA_MPS_LOG_DIRECTORY="+dirs.Log)...)
	return cmd, nil
}

// lastLine is the last non-empty line of b, bounded: what a failing
// command said last.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	l := lines[len(lines)-1]
	if len(l) > 200 {
		l = l[:200] + "…"
	}
	return l
}
