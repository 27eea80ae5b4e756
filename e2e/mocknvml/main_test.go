package mocknvml

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Tests that load the library run in a child process each (the library
// reads its profile at nvmlInit and cannot be swapped once dlopened): the
// parent test re-runs this test binary with -test.run naming a TestChild*
// function and these variables set. TestChild* functions skip otherwise.
const (
	envChild = "MOCKNVML_TEST_CHILD" // the TestChild* function to run
	envLib   = "MOCKNVML_TEST_LIB"   // path of the built library
	envCase  = "MOCKNVML_TEST_CASE"  // which case of the child's table
)

var buildDir string

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "mocknvml-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var built struct {
	sync.Once
	path string
	err  error
}

// testLib builds the library once for the whole test binary.
func testLib(t *testing.T) string {
	t.Helper()
	built.Do(func() { built.path, built.err = Build(filepath.Join(buildDir, "lib")) })
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

func profilePath(name string) string {
	return filepath.Join("..", "profiles", name+".profile")
}

// runChild runs the TestChild function test in a new process with env added
// (MOCK_NVML_* variables are cleared first) and fails t if the child fails
// or does not run. The child's output (the library's stderr included) is
// logged and returned.
func runChild(t *testing.T, test string, env ...string) string {
	t.Helper()
	ctx := context.Background()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MOCK_NVML_") && !strings.HasPrefix(kv, "MOCKNVML_TEST_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, envChild+"="+test, envLib+"="+testLib(t))
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", test, err, out)
	}
	if !strings.Contains(string(out), "--- PASS: "+test) {
		t.Fatalf("child %s did not pass:\n%s", test, out)
	}
	t.Logf("child %s:\n%s", test, out)
	return string(out)
}

// childOnly skips a TestChild function unless runChild started it.
func childOnly(t *testing.T) {
	t.Helper()
	if os.Getenv(envChild) != t.Name() {
		t.Skip("runs only in a child process started by its parent test")
	}
}
