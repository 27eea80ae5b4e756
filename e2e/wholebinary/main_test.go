package wholebinary

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

const (
	// waitTimeout bounds every wait. It is generous so that -race on a
	// loaded two-core machine never trips it; waits normally end in
	// milliseconds.
	waitTimeout = 20 * time.Second
	// pollInterval is the plugin's health poll, its shortest allowed, so a
	// thermal test takes a fraction of a second.
	pollInterval = 100 * time.Millisecond
)

// profiles are the machines every test runs on.
var profiles = []string{"dgx-h100", "pcie-4gpu", "hgx-16"}

// binary and library are built once for the package by TestMain.
var binary, library string

func TestMain(m *testing.M) {
	// The registration server logs through klog's global logger (its
	// Register handler takes the logger from the gRPC context); each test
	// gives the kubelet its own logger for everything else.
	klog.SetLogger(logr.Discard())
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "wholebinary")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if binary, err = harness.BuildPlugin(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if library, err = harness.BuildMock(filepath.Join(dir, "mock")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// node is the plugin binary on a mock machine, registered with a kubelet.
type node struct {
	k       *harness.Kubelet
	p       *harness.Plugin
	e       harness.Endpoint // the first connection
	first   harness.List     // the first device list with every GPU
	profile *mocknvml.Profile
}

// startNode starts a kubelet in a fresh directory and the plugin on the
// named profile, and waits until the kubelet has every GPU. Both stop when
// the test ends; a test that fails logs the plugin's output.
func startNode(t *testing.T, profile string) *node {
	t.Helper()
	return startNodeWith(t, profile, library)
}

// startNodeWith is startNode with the mock library at lib and the
// plugin's extra arguments.
func startNodeWith(t *testing.T, profile, lib string, args ...string) *node {
	t.Helper()
	return startNodeEnv(t, profile, lib, nil, args...)
}

// startNodeEnv is startNodeWith with more environment for the plugin
// (harness.PluginOptions.Env).
func startNodeEnv(t *testing.T, profile, lib string, env []string, args ...string) *node {
	t.Helper()
	path, err := harness.ProfilePath(profile)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := harness.ShortTempDir("gdp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	logger, _ := ktesting.NewTestContext(t)
	k, err := harness.StartKubelet(dir, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Stop(); err != nil {
			t.Error(err)
		}
	})
	p := startPluginEnv(t, lib, path, dir, env, args...)
	n := &node{k: k, p: p, profile: p.Profile}
	if n.e, err = k.WaitConnected(ctx(t), harness.ResourceName); err != nil {
		t.Fatal(err)
	}
	if n.first, err = k.WaitDevices(ctx(t), harness.ResourceName, "every GPU", harness.DeviceCount(len(n.profile.GPUs))); err != nil {
		t.Fatal(err)
	}
	return n
}

// startPlugin starts the plugin on the mock library lib with the profile
// at path, serving into dir; it stops when the test ends, and a test that
// fails logs its output.
func startPlugin(t *testing.T, lib, path, dir string, args ...string) *harness.Plugin {
	t.Helper()
	return startPluginEnv(t, lib, path, dir, nil, args...)
}

// startPluginEnv is startPlugin with more environment for the plugin.
func startPluginEnv(t *testing.T, lib, path, dir string, env []string, args ...string) *harness.Plugin {
	t.Helper()
	p, err := harness.StartPlugin(harness.PluginOptions{
		Env:                env,
		Binary:             binary,
		Library:            lib,
		Profile:            path,
		PluginDir:          dir,
		HealthPollInterval: pollInterval,
		Args:               args,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := p.Stop()
		if err != nil {
			t.Errorf("stopping the plugin: %v", err)
		}
		if err != nil || t.Failed() {
			t.Logf("plugin log:\n%s", strings.TrimSpace(p.Log()))
		}
	})
	return p
}

// ctx bounds one wait.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), waitTimeout)
	t.Cleanup(cancel)
	return c
}

// uuid returns the device ID of GPU i.
func (n *node) uuid(i int) string { return n.profile.GPUs[i].UUID }

// uuids returns the device IDs of the GPUs at the indexes.
func (n *node) uuids(idx ...int) []string {
	out := make([]string, len(idx))
	for k, i := range idx {
		out[k] = n.uuid(i)
	}
	return out
}

// all returns the device IDs of every GPU.
func (n *node) all() []string {
	out := make([]string, len(n.profile.GPUs))
	for i, g := range n.profile.GPUs {
		out[i] = g.UUID
	}
	return out
}

// gpu returns the profile's GPU with device ID id.
func (n *node) gpu(t *testing.T, id string) mocknvml.GPU {
	t.Helper()
	for _, g := range n.profile.GPUs {
		if g.UUID == id {
			return g
		}
	}
	t.Fatalf("%s is not a GPU of profile %s", id, n.profile.Name)
	return mocknvml.GPU{}
}

// forEachProfile runs test on every profile, in parallel.
func forEachProfile(t *testing.T, test func(t *testing.T, n *node)) {
	for _, name := range profiles {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, startNode(t, name))
		})
	}
}
