package computedomain

import (
	"fmt"
	"strings"
)

// IMEX is one nvidia-imex's configuration, as the files NVIDIA documents
// (config.cfg, nodes_config.cfg) carry it.
type IMEX struct {
	// BindIP is the address the daemon serves peers on (SERVER_IP_ADDRESS);
	// the node's entry's ipAddress.
	BindIP string
	// ServerPort is the peers' port (SERVER_PORT); the same on every node.
	ServerPort int
	// CmdPort is the local command port nvidia-imex-ctl asks
	// (IMEX_CMD_PORT), bound to BindIP.
	CmdPort int
	// NodesFile is where the peer list is (IMEX_NODE_CONFIG_FILE).
	NodesFile string
	// LogFile and PIDFile are the daemon's log and PID file.
	LogFile, PIDFile string
}

// Default ports, NVIDIA's.
const (
	DefaultServerPort = 50000
	DefaultCmdPort    = 50005
)

// ConfigFile renders config.cfg. Keys not set here keep nvidia-imex's
// defaults. A peer list change restarts the daemon (internal/node/imexd):
// nvidia-imex reads nodes_config.cfg at start.
func (c IMEX) ConfigFile() string {
	var b strings.Builder
	kv := func(k string, v any) { fmt.Fprintf(&b, "%s=%v\n", k, v) }
	b.WriteString("# written by gpu-device-plugin for one ComputeDomain; do not edit\n")
	kv("LOG_FILE_NAME", c.LogFile)
	kv("LOG_LEVEL", 4)
	kv("LOG_APPEND_TO_LOG", 1)
	kv("SERVER_IP_ADDRESS", c.BindIP)
	kv("SERVER_PORT", c.ServerPort)
	kv("ENABLE_AUTH_ENCRYPTION", 0)
	kv("IMEX_CMD_BIND_INTERFACE_IP", c.BindIP)
	kv("IMEX_CMD_PORT", c.CmdPort)
	kv("IMEX_CMD_ENABLED", 1)
	kv("IMEX_DAEMON_PID_FILE", c.PIDFile)
	kv("IMEX_NODE_CONFIG_FILE", c.NodesFile)
	return b.String()
}

// NodesConfigFile renders nodes_config.cfg: one peer address a line.
func NodesConfigFile(peers []string) string {
	if len(peers) == 0 {
		return ""
	}
	return strings.Join(peers, "\n") + "\n"
}

// ParseConfigFile reads config.cfg's KEY=value lines; '#' starts a
// comment. The stand-in nvidia-imex and the tests read it with this.
func ParseConfigFile(text string) (map[string]string, error) {
	kv := map[string]string{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("line %d: %q is not KEY=value", i+1, line)
		}
		kv[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return kv, nil
}
