package mpsd

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// serverName is the MPS server's executable, which the control daemon
// starts, one per user whose clients it serves.
const serverName = "nvidia-cuda-mps-server"

// ProcServers finds, in the process table under procRoot (/proc of a PID
// namespace that holds the daemons: the host's, or the plugin's when it
// runs them), the MPS servers of the GPU with uuid: processes running
// nvidia-cuda-mps-server whose environment names the GPU in
// CUDA_VISIBLE_DEVICES, as the control daemon that started them was told.
// A process that ends while it is read is skipped.
func ProcServers(procRoot, uuid string) ([]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", procRoot, err)
	}
	want := []byte("CUDA_VISIBLE_DEVICES=" + uuid)
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		dir := filepath.Join(procRoot, e.Name())
		exe, err := os.Readlink(filepath.Join(dir, "exe"))
		if err != nil || strings.TrimSuffix(filepath.Base(exe), " (deleted)") != serverName {
			continue // a kernel thread, another program, or gone
		}
		env, err := os.ReadFile(filepath.Join(dir, "environ"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the environment of MPS server %d: %w", pid, err)
		}
		if slices.ContainsFunc(bytes.Split(env, []byte{0}), func(kv []byte) bool { return bytes.Equal(kv, want) }) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
