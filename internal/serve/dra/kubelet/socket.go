package kubelet

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
)

// The kubelet's directories, as the kubeletplugin helper defaults them.
const (
	KubeletPluginsDir  = "/var/lib/kubelet/plugins"
	KubeletRegistryDir = "/var/lib/kubelet/plugins_registry"
)

// unixPathMax bounds an AF_UNIX socket path on Linux.
const unixPathMax = 108

// RollingUpdateRegistrarSocketFile is the registration socket's name for a
// pod of a rolling update, the kubeletplugin helper's: the first of
// "<driver>-<uid>-reg.sock", "<driver>-<hash of uid>-reg.sock" and
// "dra-<hash of driver and uid>-reg.sock" whose path in registryDir fits
// a Unix socket. The kubelet and the other pod see these names, so they
// must not change.
func RollingUpdateRegistrarSocketFile(registryDir, driverName string, podUID types.UID) string {
	uid := string(podUID)
	uidSum := sha256.Sum256([]byte(uid))
	bothSum := sha256.Sum256([]byte(driverName + "\x00" + uid))
	names := []string{
		driverName + "-" + uid + "-reg.sock",
		driverName + "-" + base64.RawURLEncoding.EncodeToString(uidSum[:8]) + "-reg.sock",
		"dra-" + base64.RawURLEncoding.EncodeToString(bothSum[:16]) + "-reg.sock",
	}
	for _, n := range names {
		if len(path.Join(registryDir, n)) <= unixPathMax {
			return n
		}
	}
	return names[len(names)-1]
}

// listenUnix listens on socket, removing what a previous run left there.
func listenUnix(ctx context.Context, socket string) (net.Listener, error) {
	if err := removeSocket(socket); err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unix", socket)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("listening on %s: %w", socket, err), removeSocket(socket))
	}
	return ln, nil
}

func removeSocket(socket string) error {
	if err := os.Remove(socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the socket %s: %w", socket, err)
	}
	return nil
}

// lockFile takes an exclusive lock on path, waiting for it, as etcd's
// fileutil.LockFile does for the kubeletplugin helper: an open file
// description lock where the kernel has them, else flock. The two kinds
// do not see each other, so this must choose as the helper does for two
// pods of a rolling update to exclude each other. Closing the file
// releases the lock.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("opening the lock file: %w", err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0}
	for err = unix.EINTR; errors.Is(err, unix.EINTR); {
		err = unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLKW, &lk)
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", filepath.Base(path), err)
	}
	return f, nil
}
