package harness

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// childEnv marks the re-run test process. Its value is the parent's mount
// namespace, so the child can prove it is in another one before mounting.
const childEnv = "E2E_PARENT_MOUNT_NS"

// Isolated gives the calling test an empty, private
// pluginapi.DevicePluginPath: the kubelet's real device manager
// (devicemanager.NewManagerImpl) only listens, and writes its checkpoint,
// in that fixed directory. In the parent process it re-runs the test in a
// child in a new mount namespace, reports the child's output and result,
// and returns false: the caller must return. In the child it mounts a
// tmpfs over the directory and returns true: the caller runs the scenario.
func Isolated(t *testing.T) bool {
	t.Helper()
	if parent, ok := os.LookupEnv(childEnv); ok {
		mountPluginDir(t, parent)
		return true
	}
	runChild(t)
	return false
}

func mountNamespace() (string, error) { return os.Readlink("/proc/self/ns/mnt") }

// runChild re-executes this test binary for t alone. Go's
// SysProcAttr.Unshareflags with CLONE_NEWNS unshares the mount namespace
// between fork and exec and then remounts / recursively private, as
// `unshare -m --propagation private` does, so no mount the child makes can
// propagate back to the host.
func runChild(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the kubelet's device manager only listens in /var/lib/kubelet/device-plugins, which the test covers with a tmpfs in a private mount namespace")
	}
	ns, err := mountNamespace()
	if err != nil {
		t.Skipf("mount namespaces unavailable (%v); cannot give the kubelet's device manager a private /var/lib/kubelet/device-plugins", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("finding the test binary to re-run: %v", err)
	}
	args := []string{"-test.run=^" + regexp.QuoteMeta(t.Name()) + "$", "-test.v", "-test.count=1"}
	if d, ok := t.Deadline(); ok {
		// Leave the parent time to report a child that hung.
		if left := time.Until(d) - 10*time.Second; left > 0 {
			args = append(args, "-test.timeout="+left.String())
		}
	}
	cmd := exec.CommandContext(t.Context(), exe, args...)
	cmd.Env = append(os.Environ(), childEnv+"="+ns)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if exit := (*exec.ExitError)(nil); err != nil && !errors.As(err, &exit) {
		t.Skipf("cannot start a process in a new mount namespace (%v); the kubelet's device manager needs a private /var/lib/kubelet/device-plugins", err)
	}
	t.Logf("test re-run in a private mount namespace: %s %s\n%s", exe, strings.Join(args, " "), out)
	switch {
	case err != nil:
		t.Fatalf("re-run test failed: %v", err)
	case strings.Contains(string(out), "--- SKIP: "+t.Name()+" "):
		t.Skip("re-run test skipped; see its output above")
	case !strings.Contains(string(out), "--- PASS: "+t.Name()+" "):
		t.Fatal("re-run test did not report a pass; see its output above")
	}
}

// mountPluginDir covers the device-plugin directory with a tmpfs. The
// tmpfs goes on the deepest directory of that path that exists, so that
// nothing is created on the host's file system; on a host without a kubelet
// that is /var/lib, hidden for this process only.
func mountPluginDir(t *testing.T, parentNS string) {
	t.Helper()
	dir := filepath.Clean(pluginapi.DevicePluginPath)
	ns, err := mountNamespace()
	if err != nil || ns == parentNS {
		t.Fatalf("refusing to mount over %s: mount namespace %q is the parent's %q (err %v)", dir, ns, parentNS, err)
	}
	// The namespace is already private; this is `mount --make-rprivate /`
	// once more, so that nothing below can propagate whatever unshared it.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		t.Skipf("cannot make / private in the new mount namespace: %v", err)
	}
	at := dir
	for {
		if fi, err := os.Stat(at); err == nil && fi.IsDir() {
			break
		}
		at = filepath.Dir(at)
	}
	if at == "/" {
		t.Skipf("no directory of %s exists to mount a tmpfs on without covering /", dir)
	}
	if err := syscall.Mount("tmpfs", at, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755,size=16m"); err != nil {
		t.Skipf("cannot mount a tmpfs over %s: %v", at, err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Logf("mount namespace %s (parent %s): tmpfs on %s, device-plugin directory %s", ns, parentNS, at, dir)
}
