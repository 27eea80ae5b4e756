package mpsd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
)

// start starts the daemon and sets its clients' default limits, or adopts
// one an earlier process left that answers, giving it g's limits in
// place (true). The pipe directory is emptied of a dead daemon's files,
// but kept, for running clients have it mounted, and not while a server
// of the dead daemon still runs.
func (m *Manager) start(ctx context.Context, g GPU, log *slog.Logger) (adopted bool, err error) {
	if g.Replicas < 1 {
		return false, fmt.Errorf("%d replicas", g.Replicas)
	}
	dirs := m.dirs(g.UUID)
	if adopted, err := m.adopt(g, dirs, log); adopted || err != nil {
		return adopted, err
	}
	_ = m.quit(g) // one that hangs
	if m.o.Servers != nil {
		pids, err := m.o.Servers(g.UUID)
		if err != nil {
			return false, fmt.Errorf("looking for MPS servers left on the GPU: %w", err)
		}
		if len(pids) > 0 {
			return false, fmt.Errorf("MPS server %v of an earlier control daemon still runs on the GPU and serves its clients; no daemon is started, and its pipe directory is left alone, until it ends (or is killed)", pids)
		}
	}
	for _, dir := range []string{dirs.Pipe, dirs.Log, dirs.Shm} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return false, fmt.Errorf("MPS directory: %w", err)
		}
	}
	if err := m.mountShm(dirs.Shm, log); err != nil {
		return false, err
	}
	// Clients of any user share the memory, as they would /dev/shm.
	if err := os.Chmod(dirs.Shm, 0o1777); err != nil {
		return false, fmt.Errorf("MPS shared memory directory: %w", err)
	}
	if err := emptyDir(dirs.Pipe); err != nil {
		return false, err
	}
	_ = os.Remove(filepath.Join(m.o.Root, g.UUID, limitsFile))
	if err := m.exclusive(g.UUID); err != nil {
		return false, err
	}
	cctx, cancel := context.WithTimeout(ctx, m.o.CommandTimeout)
	defer cancel()
	// Output goes to a file, not a pipe: the forked daemon would hold a
	// pipe open and Wait would never return.
	out, err := os.Create(filepath.Join(dirs.Log, "start.log"))
	if err != nil {
		return false, fmt.Errorf("MPS start log: %w", err)
	}
	defer out.Close()
	cmd, err := m.command(cctx, g, "-d")
	if err != nil {
		return false, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		said, _ := os.ReadFile(out.Name())
		return false, fmt.Errorf("%s -d: %w: %s", m.o.Binary, err, lastLine(said))
	}
	if err := m.relimit(g, false); err != nil {
		return false, err
	}
	if err := m.writeLimits(g); err != nil {
		log.Warn("the limits set were not recorded; a previous release would restart this daemon rather than adopt it", "err", err)
	}
	return false, nil
}

// exclusive puts the GPU in exclusive-process compute mode: without it a
// container that bypasses its daemon gets a context of its own, and the
// whole GPU, so a GPU whose mode cannot be set is not shared.
func (m *Manager) exclusive(uuid string) error {
	if m.o.ComputeMode == nil {
		return nil
	}
	if err := m.o.ComputeMode(uuid, true); err != nil {
		return fmt.Errorf("cannot put the GPU in exclusive-process compute mode, without which a container that bypasses its MPS daemon gets the whole GPU; its shares are withheld: %w", err)
	}
	return nil
}

// undoStart undoes what a failed start left: a half-started daemon, and
// the exclusive compute mode, unless a server of an earlier daemon still
// runs there.
func (m *Manager) undoStart(g GPU, log *slog.Logger) {
	_ = m.quit(g)
	if m.o.ComputeMode == nil {
		return
	}
	if m.o.Servers != nil {
		if pids, err := m.o.Servers(g.UUID); err != nil || len(pids) > 0 {
			return
		}
	}
	if err := m.o.ComputeMode(g.UUID, false); err != nil {
		log.Debug("cannot set the GPU's compute mode back to default after a failed start", "err", err)
	}
}

// adopt takes over a daemon an earlier process left that answers on the
// GPU's pipe: it gets g's limits in place, the GPU exclusive-process mode
// again, and its clients keep running.
func (m *Manager) adopt(g GPU, dirs Dirs, log *slog.Logger) (bool, error) {
	if _, err := os.Stat(dirs.Shm); err != nil {
		return false, nil
	}
	if _, err := m.control(g, "get_default_active_thread_percentage"); err != nil {
		return false, nil
	}
	if err := m.exclusive(g.UUID); err != nil {
		return false, err
	}
	if err := m.relimit(g, true); err != nil {
		return false, fmt.Errorf("adopting the running MPS control daemon: %w", err)
	}
	if m.o.ShmSize > 0 && !isMountPoint(dirs.Shm) {
		log.Info("the daemon's shared memory is a plain directory, as an earlier release made it; it becomes a tmpfs of its own at the daemon's next start")
	}
	if err := m.writeLimits(g); err != nil {
		log.Warn("the limits set were not recorded; a previous release would restart this daemon rather than adopt it", "err", err)
	}
	return true, nil
}

// emptyDir removes what dir holds, keeping dir.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("MPS pipe directory: %w", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("MPS pipe directory: %w", err)
		}
	}
	return nil
}
