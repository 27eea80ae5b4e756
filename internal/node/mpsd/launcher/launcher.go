// Package launcher starts MPS control daemons in a process tree apart from
// the plugin's, so that a plugin restart (an upgrade, a crash, a config
// roll) does not take the daemons, their servers and every MPS client with
// it.
//
// nvidia-cuda-mps-control -d forks the daemon, which stays in the process
// tree (and the container) of whoever ran it. The launcher (`gpu-device-
// plugin mps-launcher`, a DaemonSet of its own) is who runs it: the plugin
// asks it on a UNIX socket, one JSON Request per connection, and the next
// plugin process adopts the daemon the launcher left running (package
// mpsd). The plugin still runs the control client itself.
//
// A request names a GPU and nothing else: the launcher takes the driver
// root, /dev root, MPS directories, program, arguments and environment
// from its own configuration, so whoever can reach the socket can start
// the daemon of a GPU whose directories the plugin made, and no other
// program.
package launcher

import (
	"fmt"
	"regexp"
	"strings"
)

// Request asks the launcher to start one GPU's control daemon. Keys are
// only ever added: a launcher left running across a plugin upgrade
// (its DaemonSet updates OnDelete) must understand the newer plugin.
type Request struct {
	// GPU is the GPU's UUID (GPU-...).
	GPU string `json:"gpu"`
	// Servers asks, in place of a start, for the MPS servers running on
	// the GPU: the launcher sees the host's processes, the plugin only its
	// own.
	Servers bool `json:"servers,omitempty"`
}

// Response is the launcher's answer: OK, or Error with Output, the last
// line the control program printed; for a Servers request, their pids.
type Response struct {
	OK      bool   `json:"ok,omitempty"`
	Error   string `json:"error,omitempty"`
	Output  string `json:"output,omitempty"`
	Servers []int  `json:"servers,omitempty"`
}

// uuidPattern is a whole GPU's UUID as NVML prints it, in characters that
// cannot leave <mpsRoot>/<uuid>.
var uuidPattern = regexp.MustCompile(`^GPU-[0-9A-Za-z][0-9A-Za-z-]{0,63}$`)

// ValidGPU refuses what is not a whole GPU's UUID.
func ValidGPU(uuid string) error {
	if !uuidPattern.MatchString(uuid) {
		return fmt.Errorf("%q is not a GPU UUID (GPU- followed by letters, digits and '-', as nvidia-smi -L prints it)", truncate(uuid, 80))
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// lastLine is the last non-empty line of b, bounded.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return truncate(lines[len(lines)-1], 200)
}
