package mpsd

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// stop stops the daemon: its clients get StopGrace to end, then its
// servers are shut down and it quits; once it is gone its directories are
// removed and the GPU gets its default compute mode back.
func (m *Manager) stop(g GPU, log *slog.Logger) {
	if st := m.Query(g.UUID); st.Up && st.Clients > 0 {
		log.Info("stopping the MPS control daemon: its clients get a grace period to end, then its servers are shut down", "clients", st.Clients, "grace", m.o.StopGrace)
	}
	secs := max(int(m.o.StopGrace/time.Second), 1)
	if _, err := m.control(g, fmt.Sprintf("quit -t %d", secs)); err != nil {
		log.Debug("MPS control daemon quit", "err", err)
	} else if !m.gone(g, m.o.StopGrace+5*time.Second) {
		log.Warn("the MPS control daemon did not quit in time; removing its directories anyway", "grace", m.o.StopGrace)
	}
	shm := m.dirs(g.UUID).Shm
	unmountAll(shm, log)
	if err := os.RemoveAll(filepath.Join(m.o.Root, g.UUID)); err != nil {
		log.Warn("removing the MPS directories", "err", err, "mountsThere", mountsAt(shm))
	}
	if m.o.ComputeMode != nil {
		if err := m.o.ComputeMode(g.UUID, false); err != nil {
			log.Warn("cannot set the GPU's compute mode back to default", "err", err)
		}
	}
	m.mu.Lock()
	delete(m.states, g.UUID)
	m.bumpLocked()
	m.mu.Unlock()
	m.notify()
	log.Info("MPS control daemon stopped")
}

// gone waits, within limit, until the daemon no longer answers. The
// daemon is another process with nothing to wait on, so it is asked
// every 100ms (real time: a stop is not driven by the test clock).
func (m *Manager) gone(g GPU, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		if _, err := m.control(g, "get_server_list"); err != nil {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		t := time.NewTimer(100 * time.Millisecond)
		<-t.C
	}
}

// halt shuts the daemon's servers down by force, failing their clients at
// once, and stops the daemon, keeping its directories.
func (m *Manager) halt(g GPU, log *slog.Logger) {
	if list, err := m.control(g, "get_server_list"); err == nil {
		for _, pid := range strings.Fields(list) {
			if _, err := m.control(g, "shutdown_server "+pid+" -f"); err != nil {
				log.Warn("shutting down an MPS server by force", "server", pid, "err", err)
			}
		}
	}
	if err := m.quit(g); err != nil {
		log.Debug("MPS control daemon quit", "err", err)
	}
}

func (m *Manager) quit(g GPU) error {
	_, err := m.control(g, "quit")
	return err
}

// unmountAll unmounts what is mounted on dir, each of the mounts stacked
// there: a plugin restarted between the tmpfs's mount and its stop sees
// the one its volume brought and any that propagated on top.
func unmountAll(dir string, log *slog.Logger) {
	for range 16 {
		if !isMountPoint(dir) {
			return
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			log.Warn("unmounting the MPS shared memory", "dir", dir, "err", err)
			return
		}
	}
}
