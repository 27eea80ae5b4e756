package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// containerTimeout bounds one container's run, hook included.
const containerTimeout = 2 * time.Minute

type layout = harness.Layout

var debian, rhel = harness.Debian, harness.RHEL

// probeReport is what cudaprobe prints.
type probeReport struct {
	VisibleDevices string   `json:"visibleDevices"`
	DevNodes       []string `json:"devNodes"`
	LDConfig       []string `json:"ldconfig"`
	LDConfigError  string   `json:"ldconfigError,omitempty"`
	DlopenError    string   `json:"dlopenError,omitempty"`
	SymbolError    string   `json:"symbolError,omitempty"`
	Library        string   `json:"library,omitempty"`
	MockLibrary    bool     `json:"mockLibrary"`
	CuInit         *int     `json:"cuInit,omitempty"`
	DriverVersion  int      `json:"driverVersion,omitempty"`
	CuCount        *int     `json:"cuDeviceGetCount,omitempty"`
	Count          int      `json:"count"`
	Devices        []struct {
		Name string `json:"name"`
		UUID string `json:"uuid"`
	} `json:"devices"`
	// Listed are the entries of each directory CUDAPROBE_LIST named, and
	// ListErrors why one could not be read, by path.
	Listed     map[string][]string `json:"listed,omitempty"`
	ListErrors map[string]string   `json:"listErrors,omitempty"`
	// With CUDAPROBE_ALLOC_MIB: the MiB asked for, the CUresults of
	// cuCtxCreate and cuMemAlloc, what cuMemGetInfo said in the context,
	// or why none of it ran.
	AllocMiB    uint64 `json:"allocMiB,omitempty"`
	CtxCreate   *int   `json:"ctxCreate,omitempty"`
	MemAlloc    *int   `json:"memAlloc,omitempty"`
	MemFreeMiB  uint64 `json:"memFreeMiB,omitempty"`
	MemTotalMiB uint64 `json:"memTotalMiB,omitempty"`
	AllocError  string `json:"allocError,omitempty"`
}

// containerRun is one container in the report.
type containerRun struct {
	Image   string       `json:"image"`
	GPUs    []string     `json:"gpus"`
	CDI     []string     `json:"cdiDevices"`
	Probe   *probeReport `json:"probe,omitempty"`
	Stderr  string       `json:"stderr,omitempty"`
	Seconds float64      `json:"seconds"`
}

// containers runs the probe in a container of each image layout given one
// GPU through Allocate's CDI devices, and one given all of them.
func (c *checker) containers(ctx context.Context, s *Step) {
	if c.served == nil || len(c.served.allocations) == 0 {
		s.fail("allocations to run", fmt.Errorf("the serve step made no allocation"))
		return
	}
	var runs []*containerRun
	s.Data = &runs
	for _, l := range []layout{debian, rhel} {
		a, ok := c.served.allocations["one"]
		if !ok {
			continue
		}
		runs = append(runs, c.runProbe(ctx, s, l, c.served.cdiDir, a.ids, cdiNames(a)))
	}
	if a, ok := c.served.allocations["all"]; ok {
		runs = append(runs, c.runProbe(ctx, s, debian, c.served.cdiDir, a.ids, cdiNames(a)))
	}
}

func cdiNames(a allocation) []string { return answerOf(a.resp).CDIDevices }

// runProbe runs cudaprobe in an image of layout l with the CDI devices
// names, from the specs in specDir, injected, and checks that it sees gpus.
func (c *checker) runProbe(ctx context.Context, s *Step, l layout, specDir string, gpus, names []string) *containerRun {
	began := time.Now()
	run := &containerRun{Image: l.Name, GPUs: gpus, CDI: names}
	defer func() { run.Seconds = roundSeconds(time.Since(began)) }()
	what := fmt.Sprintf("%s image, %d GPU(s)", l.Name, len(gpus))
	rootfs, err := c.image(l)
	if !s.check(what+": image builds", err == nil, "%s", errText(err)) {
		return run
	}
	out, stderr, err := c.runContainer(ctx, rootfs, specDir, names, fmt.Sprintf("%s-%d-%d", l.Name, len(gpus), time.Now().UnixNano()), extras{})
	run.Stderr = oneLine(stderr, 2000)
	if !s.check(what+": runc runs it", err == nil, "%s", errText(err)) {
		return run
	}
	p, err := parseProbe(out)
	if !s.check(what+": probe answers", err == nil, "%s", errText(err)) {
		return run
	}
	run.Probe = p
	c.judgeProbe(s, what, p, gpus)
	return run
}

// judgeProbe checks what the probe saw against the GPUs given.
func (c *checker) judgeProbe(s *Step, what string, p *probeReport, gpus []string) {
	s.check(what+": NVIDIA_VISIBLE_DEVICES is void", p.VisibleDevices == "void", "%q (the image said all)", p.VisibleDevices)
	s.check(what+": ld cache lists libcuda.so.1", slices.ContainsFunc(p.LDConfig, func(l string) bool { return strings.HasPrefix(l, "libcuda.so.1 ") }),
		"%s %s", strings.Join(p.LDConfig, "; "), p.LDConfigError)
	var nodes []string
	for _, id := range gpus {
		if g := c.gpuByID(id); g != nil {
			nodes = append(nodes, fmt.Sprintf("/dev/nvidia%d", g.Minor))
		}
	}
	s.check(what+": its GPUs' device nodes", subset(nodes, p.DevNodes), "sees %v, want %v", p.DevNodes, nodes)
	if !s.check(what+": dlopen libcuda.so.1", p.DlopenError == "" && p.SymbolError == "", "%s%s", p.DlopenError, p.SymbolError) {
		return
	}
	if c.mock {
		s.check(what+": the mock node's stand-in libcuda (not CUDA)", p.MockLibrary, "%s", p.Library)
	} else {
		s.check(what+": the driver's libcuda", !p.MockLibrary, "%s", p.Library)
	}
	if !s.check(what+": cuInit", p.CuInit != nil && *p.CuInit == 0, "CUresult %v", deref(p.CuInit)) {
		return
	}
	s.check(what+": cuDeviceGetCount equals the GPUs allocated", p.CuCount != nil && *p.CuCount == 0 && p.Count == len(gpus),
		"count %d (CUresult %v), allocated %d", p.Count, deref(p.CuCount), len(gpus))
	if c.mock {
		return
	}
	var seen []string
	for _, d := range p.Devices {
		seen = append(seen, d.UUID)
	}
	s.check(what+": CUDA sees the allocated GPUs' UUIDs", sameSet(seen, gpus), "CUDA %v, allocated %v", seen, gpus)
}

func deref(p *int) any {
	if p == nil {
		return "none"
	}
	return *p
}

func sameSet(a, b []string) bool {
	return len(a) == len(b) && subset(a, b) && subset(b, a)
}

// gpuByID finds a listed GPU by its device ID (its UUID).
func (c *checker) gpuByID(id string) *listedGPU {
	if c.listed == nil {
		return nil
	}
	for i, g := range c.listed.GPUs {
		if g.UUID == id || slices.Contains(g.DeviceIDs, id) {
			return &c.listed.GPUs[i]
		}
	}
	return nil
}

func parseProbe(stdout string) (*probeReport, error) {
	for _, line := range strings.Split(stdout, "\n") {
		if js, ok := strings.CutPrefix(line, "cudaprobe: "); ok {
			var p probeReport
			if err := json.Unmarshal([]byte(js), &p); err != nil {
				return nil, fmt.Errorf("probe report %q: %w", js, err)
			}
			return &p, nil
		}
	}
	return nil, fmt.Errorf("no probe report in %q", oneLine(stdout, 500))
}

// image builds a root file system of distribution l, once: its library
// directory holding the bundle's C library, the loader where the probe
// looks for it, /etc/ld.so.conf including ld.so.conf.d, a static
// ldconfig, the probe, and the image's own ld cache made without the
// driver.
func (c *checker) image(l layout) (string, error) {
	root := filepath.Join(c.work, "images", l.Name)
	if _, err := os.Stat(root); err == nil {
		return root, nil
	}
	src := filepath.Join(c.o.bundle, imageDir)
	libs, err := os.ReadDir(src)
	if err != nil {
		return "", err
	}
	for _, d := range []string{l.LibDir, "etc/ld.so.conf.d", "dev", "proc", "sys", "tmp", "sbin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	for _, f := range libs {
		to := filepath.Join(root, l.LibDir, f.Name())
		if f.Name() == "ldconfig" {
			to = filepath.Join(root, "sbin/ldconfig")
		}
		if err := copyFile(filepath.Join(src, f.Name()), to); err != nil {
			return "", err
		}
	}
	// The loader's path in every x86-64 program: /lib64 is a directory
	// with a link on Debian, a link to usr/lib64 on RHEL.
	if l.LibDir == "/usr/lib64" {
		err = os.Symlink("usr/lib64", filepath.Join(root, "lib64"))
	} else if err = os.MkdirAll(filepath.Join(root, "lib64"), 0o755); err == nil {
		err = os.Symlink(filepath.Join(l.LibDir, "ld-linux-x86-64.so.2"), filepath.Join(root, "lib64/ld-linux-x86-64.so.2"))
	}
	if err != nil {
		return "", err
	}
	files := map[string]string{
		"etc/ld.so.conf":             "include /etc/ld.so.conf.d/*.conf\n",
		"etc/ld.so.conf.d/libc.conf": l.LibDir + "\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	if err := copyFile(filepath.Join(c.o.bundle, probeFile), filepath.Join(root, "cudaprobe")); err != nil {
		return "", err
	}
	if out, err := exec.Command(filepath.Join(root, "sbin/ldconfig"), "-r", root).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ldconfig -r %s: %w: %s", root, err, out)
	}
	return root, nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

// extras are what a container gets beyond its CDI devices: more
// environment and mounts (from Allocate's answer, or the probe's
// settings).
type extras struct {
	env    []string
	mounts []oci.Mount
}

// runContainer injects names from the CDI specs in specDir into an OCI
// spec for rootfs, as containerd does, and runs /cudaprobe in it with
// runc. stderr holds runc's and the hook's words.
func (c *checker) runContainer(ctx context.Context, rootfs, specDir string, names []string, id string, x extras) (stdout, stderr string, err error) {
	runCtx, cancel := context.WithTimeout(ctx, containerTimeout)
	defer cancel()
	cmd, err := c.containerCmd(runCtx, rootfs, specDir, names, id, x)
	if err != nil {
		return "", "", err
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), errb.String(), fmt.Errorf("runc run: %w: %s", err, oneLine(errb.String(), 1500))
	}
	return out.String(), errb.String(), nil
}

// runcCommand is runc with its environment, with this check's state
// folder.
func (c *checker) runcCommand(ctx context.Context, args ...string) (*exec.Cmd, error) {
	runc, env, err := c.runc()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, runc, args...)
	cmd.Env = append(os.Environ(), env...)
	return cmd, nil
}

// containerCmd writes the bundle of container id, which runs /cudaprobe
// in rootfs with names from the CDI specs in specDir injected, as
// containerd does, and x added, and returns the `runc run` that runs it,
// not started.
func (c *checker) containerCmd(ctx context.Context, rootfs, specDir string, names []string, id string, x extras) (*exec.Cmd, error) {
	bundle := filepath.Join(c.work, "bundles", id)
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return nil, err
	}
	spec, err := c.runcCommand(ctx, "spec", "--bundle", bundle)
	if err != nil {
		return nil, err
	}
	if out, err := spec.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("runc spec: %w: %s", err, out)
	}
	var s oci.Spec
	raw, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, err
	}
	s.Root = &oci.Root{Path: rootfs, Readonly: true}
	s.Hostname = "gpu-check"
	s.Process.Terminal = false
	// What an nvidia/cuda image sets.
	s.Process.Env = setEnv(append(s.Process.Env, "NVIDIA_VISIBLE_DEVICES=all"), x.env...)
	s.Process.Args = []string{"/cudaprobe"}
	// A mount given replaces the spec's own at the same place (/dev/shm).
	for _, m := range x.mounts {
		s.Mounts = slices.DeleteFunc(s.Mounts, func(o oci.Mount) bool { return o.Destination == m.Destination })
	}
	s.Mounts = append(s.Mounts, x.mounts...)
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(specDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("reading the CDI specs in %s: %w", specDir, err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		return nil, fmt.Errorf("the CDI cache refused specs: %v", errs)
	}
	if unresolved, err := cache.InjectDevices(&s, names...); err != nil {
		return nil, fmt.Errorf("injecting %v: unresolved %v: %w", names, unresolved, err)
	}
	if raw, err = json.MarshalIndent(&s, "", "  "); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), raw, 0o644); err != nil {
		return nil, err
	}
	return c.runcCommand(ctx, "--root", c.runcRoot(), "run", "--bundle", bundle, containerName(id))
}

// setEnv sets each KEY=VALUE of kvs in env, replacing an entry of the
// same key: a process's getenv finds the first of two.
func setEnv(env []string, kvs ...string) []string {
	for _, kv := range kvs {
		k, _, _ := strings.Cut(kv, "=")
		i := slices.IndexFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		if i >= 0 {
			env[i] = kv
		} else {
			env = append(env, kv)
		}
	}
	return env
}

func (c *checker) runcRoot() string { return filepath.Join(c.work, "runc") }

func containerName(id string) string { return "gpu-check-" + id }

// held is a container whose probe printed its report and now holds what
// it made (CUDAPROBE_HOLD) until release.
type held struct {
	c      *checker
	id     string
	cmd    *exec.Cmd
	cancel context.CancelFunc
	stdin  io.WriteCloser
	stderr *syncBuffer
	// rest is closed once stdout ends.
	rest chan struct{}
}

// startHeld runs a container as runContainer does, with the probe told
// to hold, and returns once the probe printed its report: the container
// still runs, holding its context and allocation, until release.
func (c *checker) startHeld(ctx context.Context, rootfs, specDir string, names []string, id string, x extras) (*held, string, error) {
	hctx, cancel := context.WithTimeout(ctx, 2*containerTimeout)
	x.env = append(x.env, fmt.Sprintf("CUDAPROBE_HOLD=%d", int((2*containerTimeout).Seconds())))
	cmd, err := c.containerCmd(hctx, rootfs, specDir, names, id, x)
	if err != nil {
		cancel()
		return nil, "", err
	}
	h := &held{c: c, id: id, cmd: cmd, cancel: cancel, stderr: &syncBuffer{}, rest: make(chan struct{})}
	cmd.Stderr = h.stderr
	stdout, err := cmd.StdoutPipe()
	if err == nil {
		h.stdin, err = cmd.StdinPipe()
	}
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		cancel()
		return nil, "", fmt.Errorf("runc run: %w", err)
	}
	report := make(chan string, 1)
	go func() {
		defer close(h.rest)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var out strings.Builder
		sent := false
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if !sent && strings.HasPrefix(sc.Text(), "cudaprobe: ") {
				report <- out.String()
				sent = true
			}
		}
		if !sent {
			report <- out.String()
		}
	}()
	select {
	case out := <-report:
		if !strings.Contains(out, "cudaprobe: ") {
			h.release()
			return nil, out, fmt.Errorf("runc run: the probe printed no report: %s", oneLine(h.stderr.String(), 1500))
		}
		return h, out, nil
	case <-hctx.Done():
		h.release()
		return nil, "", fmt.Errorf("runc run: no probe report within %v: %s", 2*containerTimeout, oneLine(h.stderr.String(), 1500))
	}
}

// release closes the probe's stdin, so that it exits, and waits for the
// container to end; one that does not within containerTimeout is killed
// and deleted. It returns runc's and the hook's words.
func (h *held) release() string {
	h.stdin.Close()
	select {
	case <-h.rest:
	case <-time.After(containerTimeout):
		// The probe ignored its closed stdin: runc's own kill, then ours.
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if cmd, err := h.c.runcCommand(ctx, "--root", h.c.runcRoot(), "delete", "--force", containerName(h.id)); err == nil {
			_ = cmd.Run()
		}
		h.cancel()
	}
	_ = h.cmd.Wait()
	h.cancel()
	return h.stderr.String()
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
