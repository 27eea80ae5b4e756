package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// `gpu-device-plugin serve` in DRA mode execs gpu-device-plugin-dra from
// its own directory (else $PATH), and in device-plugin mode
// gpu-device-plugin-dp from its own directory, so the image and the
// packages install them beside the plugin. The ComputeDomain controller,
// gpu-device-plugin-controller, is there too: gpu-device-plugin-dra
// compute-domain-controller, which charts of earlier releases run, execs
// it from its own directory.
const (
	draName               = "gpu-device-plugin-dra"
	imageDRAPath          = "/usr/bin/" + draName
	packageDRAPath        = "/usr/bin/" + draName
	dpName                = "gpu-device-plugin-dp"
	imageDPPath           = "/usr/bin/" + dpName
	packageDPPath         = "/usr/bin/" + dpName
	controllerName        = "gpu-device-plugin-controller"
	imageControllerPath   = "/usr/bin/" + controllerName
	packageControllerPath = "/usr/bin/" + controllerName
)

var (
	draBuildOnce sync.Once
	draBuildDir  string
)

// draBuild is a directory holding gpu-device-plugin, gpu-device-plugin-dp,
// gpu-device-plugin-dra and gpu-device-plugin-controller as `make build`
// builds them (stamped with testVersion and testCommit), built once for
// the whole run.
func draBuild(t *testing.T) string {
	t.Helper()
	draBuildOnce.Do(func() {
		bin := filepath.Join(shared, "dra-build")
		runMake(t, "BIN="+bin, "VERSION="+testVersion, "COMMIT="+testCommit,
			filepath.Join(bin, "gpu-device-plugin"), filepath.Join(bin, dpName), filepath.Join(bin, draName), filepath.Join(bin, controllerName))
		draBuildDir = bin
	})
	if draBuildDir == "" {
		t.Fatal("the plugin and its daemons were not built (see the first test that asked for them)")
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

// runController runs `gpu-device-plugin-dra compute-domain-controller`, as
// charts of earlier releases do, with a kubeconfig that does not exist and
// only PATH in its environment.
func runController(t *testing.T, dra string) (string, error) {
	t.Helper()
	cmd := exec.Command(dra, "compute-domain-controller", "--namespace=gpu", "--kubeconfig=/nonexistent")
	cmd.Env = []string{"PATH=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// checkControllerHandedOver wants runController's gpu-device-plugin-dra to
// have become gpu-device-plugin-controller, with its arguments: a non-zero
// exit with one error line, the controller's, naming the kubeconfig.
func checkControllerHandedOver(t *testing.T, out string, err error) {
	t.Helper()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("%s compute-domain-controller with no kubeconfig: %v, want a non-zero exit\n%s", draName, err, out)
	}
	if !strings.HasPrefix(out, controllerName+": ") || strings.Count(out, "\n") != 1 || !strings.Contains(out, "/nonexistent") {
		t.Errorf("%s compute-domain-controller: %q, want %s's one error line about --kubeconfig /nonexistent", draName, out, controllerName)
	}
}

// TestControllerHandOver runs make's gpu-device-plugin-dra as charts of
// earlier releases run the ComputeDomain controller: it becomes
// gpu-device-plugin-controller found beside it, and without one it says,
// in one line, what is missing.
func TestControllerHandOver(t *testing.T) {
	bin := draBuild(t)
	t.Run("beside", func(t *testing.T) {
		out, err := runController(t, filepath.Join(bin, draName))
		checkControllerHandedOver(t, out, err)
	})
	t.Run("absent", func(t *testing.T) {
		alone := filepath.Join(t.TempDir(), draName)
		if err := os.WriteFile(alone, mustRead(t, filepath.Join(bin, draName)), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := runController(t, alone)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("compute-domain-controller without %s: %v, want a non-zero exit\n%s", controllerName, err, out)
		}
		if !strings.HasPrefix(out, draName+": ") || strings.Count(out, "\n") != 1 || !strings.Contains(out, controllerName+" is not beside") {
			t.Errorf("compute-domain-controller without %s: %q, want %s's one line naming it", controllerName, out, draName)
		}
	})
}

// TestDevicePluginHandOver runs make's gpu-device-plugin in device-plugin
// mode on a node without a driver: it becomes gpu-device-plugin-dp found
// beside it (the same PID, make's stamp), which serves until SIGTERM; a
// copy alone serves in its own process and says so. gpu-device-plugin-dp
// on $PATH is not used.
func TestDevicePluginHandOver(t *testing.T) {
	bin := draBuild(t)
	plugin := filepath.Join(bin, "gpu-device-plugin")
	alone := filepath.Join(t.TempDir(), "gpu-device-plugin")
	if err := os.WriteFile(alone, mustRead(t, plugin), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Run("beside", func(t *testing.T) {
		exe, out := serveUntilUp(t, plugin, t.TempDir(), "serving through the device-plugin API")
		if exe != filepath.Join(bin, dpName) {
			t.Errorf("the serving process runs %s, want %s", exe, filepath.Join(bin, dpName))
		}
		for _, want := range []string{"executable=" + filepath.Join(bin, dpName), "executable=" + dpName + " version=" + testVersion + " commit=" + testCommit} {
			if !strings.Contains(out, want) {
				t.Errorf("no %q in serve's output:\n%s", want, out)
			}
		}
	})
	t.Run("alone, with one on PATH", func(t *testing.T) {
		exe, out := serveUntilUp(t, alone, bin, `executable="this process"`)
		if exe != alone {
			t.Errorf("the serving process runs %s, want %s itself", exe, alone)
		}
		if strings.Contains(out, "serving through the device-plugin API") {
			t.Errorf("%s ran:\n%s", dpName, out)
		}
	})
}

// serveUntilUp starts binary's serve in device-plugin mode with everything
// under a temporary directory, PATH path, and a driver root with no
// driver; once a line holding up appears, it reads the process's
// executable, stops it with SIGTERM and wants a clean exit. It returns the
// executable and the output.
func serveUntilUp(t *testing.T, binary, path, up string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(binary, "serve", "--driver-root", dir, "--sysfs-root", dir, "--dev-root", dir,
		"--device-plugin-dir", dir, "--state-dir", dir, "--cdi-spec-dir", dir, "--device-info-dir", dir,
		"--pod-resources-socket", "", "--runtime-config-root", "", "--node-labels", "none", "--metrics-address", "")
	cmd.Env = []string{"PATH=" + path}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var out strings.Builder
	lines := bufio.NewScanner(r)
	found := false
	for !found && lines.Scan() {
		out.WriteString(lines.Text() + "\n")
		found = strings.Contains(lines.Text(), up)
	}
	if !found {
		cmd.Wait()
		t.Fatalf("%s serve ended without %q:\n%s", binary, up, out.String())
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid))
	if err != nil {
		t.Error(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
		out.WriteString(lines.Text() + "\n")
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "msg=stopped") {
		t.Errorf("no stop line after SIGTERM:\n%s", out.String())
	}
	return exe, out.String()
}
