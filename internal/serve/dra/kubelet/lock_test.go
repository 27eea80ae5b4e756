package kubelet

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
)

// TestLockExcludesUpstream: the lock a pod of a rolling update takes is
// the one the kubeletplugin helper (etcd's fileutil) takes in the other
// pod, so each waits for the other.
func TestLockExcludesUpstream(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serialize.lock")
	f, err := lockFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fileutil.TryLockFile(path, os.O_RDWR|os.O_CREATE, 0o666); !errors.Is(err, fileutil.ErrLocked) {
		t.Fatalf("the helper's lock while ours is held: %v, want ErrLocked", err)
	}
	f.Close()
	theirs, err := fileutil.TryLockFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		t.Fatalf("the helper's lock after ours: %v", err)
	}
	theirs.Close()
}
