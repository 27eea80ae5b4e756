package deploy

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// The CDI hook ships in the image, for the chart's init container to copy
// onto the host, and in the node packages at the plugin's default
// cdiHookPath.
const (
	hookName        = "gpu-device-plugin-cdi-hook"
	imageHookPath   = "/usr/bin/" + hookName
	packageHookPath = "/usr/libexec/gpu-device-plugin/" + hookName
)

// The packages install the hook where the plugin looks for it by default.
func TestHookPackagedAtDefaultPath(t *testing.T) {
	if packageHookPath != config.DefaultCDIHookPath {
		t.Errorf("the packages install the hook at %s, the plugin's default cdiHookPath is %s", packageHookPath, config.DefaultCDIHookPath)
	}
}

// make builds the hook static and stamped: the container runtime runs it
// on the host, whatever the host's libc.
func TestHookBuild(t *testing.T) {
	bin := hook(t)
	checkStatic(t, bin, mustRead(t, bin))
	checkHookVersion(t, exec.Command(bin, "version"))
}

// checkStatic fails unless binary needs neither a dynamic loader nor any
// shared library.
func checkStatic(t *testing.T, what string, binary []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(binary))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s is dynamically linked (PT_INTERP): it would not run on a host with another libc", what)
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("%s needs shared libraries %q (%v)", what, libs, err)
	}
}

// checkHookVersion runs `gpu-device-plugin-cdi-hook version` and wants the
// stamp of make's VERSION and COMMIT.
func checkHookVersion(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s version: %v\n%s", hookName, err, out)
	}
	if !strings.Contains(string(out), hookName+" "+testVersion+"\n") || !strings.Contains(string(out), testCommit) {
		t.Errorf("%s version is not stamped with %s %s:\n%s", hookName, testVersion, testCommit, out)
	}
}

// checkInstallsHook runs the DaemonSet's install-cdi-hook init container
// with the real hook, its host directory moved under a temporary root, and
// checks that it leaves an executable hook where --cdi-hook-path says.
func checkInstallsHook(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
		t.Fatalf("%d init containers and %d containers, want 1 and 1", len(spec.InitContainers), len(spec.Containers))
	}
	init := spec.InitContainers[0]
	hookPath, ok := flagValue(spec.Containers[0].Args, "cdi-hook-path")
	if !ok {
		t.Fatalf("no --cdi-hook-path in args %q", spec.Containers[0].Args)
	}
	argv := append(append([]string{}, init.Command...), init.Args...)
	if len(argv) == 0 || argv[0] != imageHookPath {
		t.Fatalf("init container runs %q, want the image's %s", argv, imageHookPath)
	}
	root := t.TempDir()
	args := argv[1:]
	for i, a := range args {
		if d, ok := strings.CutPrefix(a, "--dir="); ok {
			args[i] = "--dir=" + filepath.Join(root, d)
		} else if a == "--dir" && i+1 < len(args) {
			args[i+1] = filepath.Join(root, args[i+1])
		}
	}
	cmd := exec.Command(hook(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("init container %s (%s %s): %v\n%s", init.Name, hook(t), strings.Join(args, " "), err, out)
	}
	installed := filepath.Join(root, hookPath)
	fi, err := os.Stat(installed)
	if err != nil {
		t.Fatalf("after the init container, --cdi-hook-path=%s: %v", hookPath, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o755 {
		t.Errorf("installed hook %s: mode %s, want a regular file, 0755", hookPath, fi.Mode())
	}
	if !bytes.Equal(mustRead(t, installed), mustRead(t, hook(t))) {
		t.Errorf("installed hook %s is not the binary the init container ran", hookPath)
	}
	checkHookVersion(t, exec.Command(installed, "version"))
}
