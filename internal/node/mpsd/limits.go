package mpsd

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/atomicfile"
)

// limitsFile records, beside a GPU's directories, the limits its daemon
// was given, so that the next plugin process can tell whether to adopt it.
const limitsFile = "limits.json"

// relimit gives the daemon g's default limits, and its running servers
// too when servers is set (a change in place), then reads the defaults
// back: a daemon that did not take them is not up.
func (m *Manager) relimit(g GPU, servers bool) error {
	pct, mib := g.DefaultThreadPercentage(), g.DefaultMemoryMiB()
	cmds := []string{fmt.Sprintf("set_default_active_thread_percentage %d", pct)}
	if mib > 0 {
		// Device 0: CUDA_VISIBLE_DEVICES shows the daemon this GPU alone.
		cmds = append(cmds, fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", mib))
	}
	if servers {
		list, err := m.control(g, "get_server_list")
		if err != nil {
			return err
		}
		for _, pid := range strings.Fields(list) {
			cmds = append(cmds, fmt.Sprintf("set_active_thread_percentage %s %d", pid, pct))
			if mib > 0 {
				cmds = append(cmds, fmt.Sprintf("set_device_pinned_mem_limit %s 0 %dM", pid, mib))
			}
		}
	}
	for _, c := range cmds {
		if _, err := m.control(g, c); err != nil {
			return err
		}
	}
	said, err := m.control(g, "get_default_active_thread_percentage")
	if err != nil {
		return err
	}
	if got, err := strconv.ParseFloat(strings.TrimSpace(said), 64); err != nil || int(got) != pct {
		return fmt.Errorf("the MPS control daemon did not take its limits: asked for %d%% of the threads, it says %q", pct, said)
	}
	if mib == 0 {
		return nil
	}
	said, err = m.control(g, "get_default_device_pinned_mem_limit 0")
	if err != nil {
		return err
	}
	if got, ok := parseMiB(said); ok && got != mib {
		return fmt.Errorf("the MPS control daemon did not take its limits: asked for %d MiB of pinned memory, it says %q", mib, said)
	}
	return nil
}

// parseMiB reads a memory size as the control daemon writes one (its last
// field: 1024M, 2G, 512MB), in MiB; false when it cannot tell.
func parseMiB(said string) (uint64, bool) {
	f := strings.Fields(said)
	if len(f) == 0 {
		return 0, false
	}
	v := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(f[len(f)-1]), "B"), "I")
	unit := uint64(1)
	switch {
	case strings.HasSuffix(v, "K"):
		unit = 1 << 10
	case strings.HasSuffix(v, "M"):
		unit = 1 << 20
	case strings.HasSuffix(v, "G"):
		unit = 1 << 30
	case strings.HasSuffix(v, "T"):
		unit = 1 << 40
	}
	if unit > 1 {
		v = v[:len(v)-1]
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return uint64(n*float64(unit)) >> 20, true
}

// limits is limitsFile's content. Keys are only ever added; a reader
// compares the keys it knows.
type limits struct {
	ThreadPercentage int    `json:"threadPercentage"`
	PinnedMemoryMiB  uint64 `json:"pinnedMemoryMiB"`
}

func limitsOf(g GPU) limits {
	return limits{ThreadPercentage: g.DefaultThreadPercentage(), PinnedMemoryMiB: g.DefaultMemoryMiB()}
}

func (m *Manager) writeLimits(g GPU) error {
	b, err := json.Marshal(limitsOf(g))
	if err != nil {
		return err
	}
	_, err = atomicfile.Write(filepath.Join(m.o.Root, g.UUID, limitsFile), b, atomicfile.Options{})
	return err
}
