package deploy

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// `gpu-device-plugin serve` in DRA mode execs gpu-device-plugin-dra from
// its own directory (else $PATH), so the image and the packages install it
// beside the plugin.
const (
	draName        = "gpu-device-plugin-dra"
	imageDRAPath   = "/usr/bin/" + draName
	packageDRAPath = "/usr/bin/" + draName
)

var (
	draBuildOnce sync.Once
	draBuildDir  string
)

// draBuild is a directory holding gpu-device-plugin and
// gpu-device-plugin-dra as `make build` builds them (stamped with
// testVersion and testCommit), built once for the whole run.
func draBuild(t *testing.T) string {
	t.Helper()
	draBuildOnce.Do(func() {
		bin := filepath.Join(shared, "dra-build")
		runMake(t, "BIN="+bin, "VERSION="+testVersion, "COMMIT="+testCommit,
			filepath.Join(bin, "gpu-device-plugin"), filepath.Join(bin, draName))
		draBuildDir = bin
	})
	if draBuildDir == "" {
		t.Fatal("the plugin and its DRA executable were not built (see the first test that asked for them)")
	}
	return draBuildDir
}

// handOverArgs is serve in DRA mode with every directory it touches under
// dir and a kubeconfig that does not exist: gpu-device-plugin-dra fails at
// its first step, naming the kubeconfig, before it touches NVML or the
// kubelet.
func handOverArgs(dir string) []string {
	return []string{"serve", "--kubelet-api=dra", "--kubeconfig", "/nonexistent", "--node-name", "n",
		"--dra-plugin-dir", dir, "--plugin-registry-dir", dir, "--cdi-spec-dir", dir,
		"--state-dir", dir, "--device-info-dir", dir, "--driver-root", dir}
}

// checkHandedOver wants serve to have become gpu-device-plugin-dra: a
// non-zero exit whose error line is the DRA executable's and names the
// kubeconfig, after its start-up line with make's stamp and the
// directories serve's flags set (the configuration was handed over).
func checkHandedOver(t *testing.T, out string, err error, dir string) {
	t.Helper()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("serve --kubelet-api=dra with no kubeconfig: %v, want a non-zero exit\n%s", err, out)
	}
	// gpu-device-plugin-dra logs its start before it fails, so its error
	// is the last line, not the first.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, draName+": ") || !strings.Contains(last, "kubeconfig") || !strings.Contains(last, "/nonexistent") {
		t.Errorf("serve --kubelet-api=dra: last line %q, want %s's error about --kubeconfig /nonexistent\n%s", last, draName, out)
	}
	for _, want := range []string{"starting gpu-device-plugin in DRA mode", "version=" + testVersion, "commit=" + testCommit, "pluginDir=" + dir, "driverRoot=" + dir} {
		if !strings.Contains(out, want) {
			t.Errorf("serve --kubelet-api=dra: no %q in its output: not %s with make's stamp and serve's flags\n%s", want, draName, out)
		}
	}
}

// runServe runs a plugin binary with the handover arguments and only PATH
// in its environment.
func runServe(t *testing.T, binary, path, dir string) (string, error) {
	t.Helper()
	cmd := exec.Command(binary, handOverArgs(dir)...)
	cmd.Env = []string{"PATH=" + path}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestDRAHandOver runs make's gpu-device-plugin in DRA mode: it becomes
// gpu-device-plugin-dra found beside it (through a symlink too) or on
// $PATH, with the configuration it resolved, and without one it says what
// is missing.
func TestDRAHandOver(t *testing.T) {
	bin := draBuild(t)
	plugin := filepath.Join(bin, "gpu-device-plugin")
	noPath := t.TempDir() // a $PATH with nothing on it
	// A copy of the plugin alone in a directory.
	alone := filepath.Join(t.TempDir(), "gpu-device-plugin")
	if err := os.WriteFile(alone, mustRead(t, plugin), 0o755); err != nil {
		t.Fatal(err)
	}

	t.Run("beside", func(t *testing.T) {
		dir := t.TempDir()
		out, err := runServe(t, plugin, noPath, dir)
		checkHandedOver(t, out, err, dir)
	})
	t.Run("beside the symlink's target", func(t *testing.T) {
		link := filepath.Join(t.TempDir(), "gpu-device-plugin")
		if err := os.Symlink(plugin, link); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		out, err := runServe(t, link, noPath, dir)
		checkHandedOver(t, out, err, dir)
	})
	t.Run("on PATH", func(t *testing.T) {
		dir := t.TempDir()
		out, err := runServe(t, alone, bin, dir)
		checkHandedOver(t, out, err, dir)
	})
	t.Run("absent", func(t *testing.T) {
		out, err := runServe(t, alone, noPath, t.TempDir())
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("serve --kubelet-api=dra without %s: %v, want a non-zero exit\n%s", draName, err, out)
		}
		if !strings.HasPrefix(out, "gpu-device-plugin: ") || !strings.Contains(out, draName) || strings.Contains(out, draName+": ") {
			t.Errorf("serve --kubelet-api=dra without %s: want gpu-device-plugin's error naming it:\n%s", draName, out)
		}
	})
}
