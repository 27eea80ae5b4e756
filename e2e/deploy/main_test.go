package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

var (
	shared     string // a directory for the whole run, removed at the end
	pluginOnce sync.Once
	pluginBin  string
	pluginErr  error
	hookOnce   sync.Once
	hookBin    string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deploy-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// plugin is the plugin binary, built once for the whole run.
func plugin(t *testing.T) string {
	t.Helper()
	pluginOnce.Do(func() { pluginBin, pluginErr = harness.BuildPlugin(filepath.Join(shared, "plugin")) })
	if pluginErr != nil {
		t.Fatal(pluginErr)
	}
	return pluginBin
}

// hook is the CDI hook as `make build` builds it (static, stamped with
// testVersion and testCommit), built once for the whole run.
func hook(t *testing.T) string {
	t.Helper()
	hookOnce.Do(func() {
		bin := filepath.Join(shared, "hook")
		target := filepath.Join(bin, hookName)
		runMake(t, "BIN="+bin, "VERSION="+testVersion, "COMMIT="+testCommit, target)
		hookBin = target
	})
	if hookBin == "" {
		t.Fatal("the CDI hook was not built (see the first test that asked for it)")
	}
	return hookBin
}

// runMake runs a target of the repository's Makefile, as a person would,
// with the parent make's settings (make test) kept out.
func runMake(t *testing.T, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	root := repoPath(t)
	cmd := exec.Command("make", append([]string{"-C", root, "--no-print-directory"}, args...)...)
	for _, e := range os.Environ() {
		if k, _, _ := strings.Cut(e, "="); k == "MAKEFLAGS" || k == "MFLAGS" || k == "MAKELEVEL" {
			continue
		}
		cmd.Env = append(cmd.Env, e)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// isRoot says whether the test may install packages and chroot.
func isRoot() bool { return os.Geteuid() == 0 }
