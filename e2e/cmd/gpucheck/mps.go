package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/klog/v2"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpsexec"
)

// The MPS step shares one GPU as mpsReplicas replicas of mpsResource, one
// share per container (failRequestsGreaterThanOne).
const (
	mpsResource = "nvidia.com/gpu.mps"
	mpsReplicas = 2
	// What the plugin gives an MPS client: its daemon's pipe directory and
	// shared memory, mounted, and its limits.
	mpsPipeMount  = "/tmp/nvidia-mps"
	mpsShmMount   = "/dev/shm"
	mpsPipeEnv    = "CUDA_MPS_PIPE_DIRECTORY"
	mpsThreadEnv  = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	mpsPinnedEnv  = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	mpsShmMarker  = "gpu-check-marker"
	mpsDaemonUp   = "MPS control daemon up"
	mpsModeFailed = "cannot set the GPU's compute mode"
	// cudaOutOfMemory is CUDA_ERROR_OUT_OF_MEMORY.
	cudaOutOfMemory = 2
	// mpsLimitNotRun says why the mock node runs no limit test.
	mpsLimitNotRun = "not run on the mock (stand-in libcuda)"
)

type mpsData struct {
	GPU       string `json:"gpu"`
	MemoryMiB uint64 `json:"memoryMiB"`
	Replicas  int    `json:"replicas"`
	// ShareMiB and ThreadPercentage are one replica's share, as this
	// check computes it from the GPU's memory.
	ShareMiB         uint64 `json:"shareMiB"`
	ThreadPercentage int    `json:"threadPercentage"`
	// Runs are the GPU shared in each of mpsWays, in order.
	Runs []*mpsRun `json:"runs"`
	// Limit is the limit test, run once, in the launcher's way.
	Limit        []mpsAlloc `json:"limit,omitempty"`
	LimitSkipped string     `json:"limitSkipped,omitempty"`
	// PluginLog are the plugins' and the launcher's log lines about MPS,
	// warnings and errors.
	PluginLog []string `json:"pluginLog"`
}

// mpsWay is where the plugin and the MPS control daemon run.
type mpsWay struct {
	// name prefixes the way's checks and is its run's name.
	name string
	// ownPID: the plugin in a PID namespace of its own, as a pod without
	// hostPID.
	ownPID bool
	// launcher: the daemon started by mps-launcher in the host's PID
	// namespace (the chart's DaemonSet, hostPID), the plugin asking it on
	// --mps-launcher-socket; the plugin is then restarted and must adopt
	// the daemon, and the limit test runs.
	launcher bool
}

// mpsWays are the ways the MPS step shares the GPU, one after the other.
var mpsWays = []mpsWay{
	{name: "hostPID"},
	{name: "podPID", ownPID: true},
	{name: "launcher", ownPID: true, launcher: true},
}

// mpsRun is the GPU shared in one way.
type mpsRun struct {
	Name string `json:"name"`
	// PIDNamespace is the plugin's: "host" or "own".
	PIDNamespace string `json:"pidNamespace"`
	Launcher     bool   `json:"launcher"`
	MPSRoot      string `json:"mpsRoot"`
	// From the plugin's start: registration, the daemon up (the plugin's
	// log), every replica healthy in ListAndWatch; and the last two apart.
	RegisteredMs    float64         `json:"registeredMs"`
	DaemonUpMs      float64         `json:"daemonUpMs"`
	SharesOfferedMs float64         `json:"sharesOfferedMs"`
	UpToOfferedMs   float64         `json:"daemonUpToOfferedMs"`
	Answers         []answer        `json:"answers"`
	PipeFiles       []string        `json:"pipeFiles"`
	DaemonThreads   string          `json:"daemonThreadPercentage"`
	ControlLog      []string        `json:"controlLog"`
	ComputeMode     string          `json:"computeMode"`
	Containers      []*containerRun `json:"containers"`
	// DaemonPid is what the daemon wrote to its pid file, in its own PID
	// namespace.
	DaemonPid int `json:"daemonPid"`
	// AfterStop is whether the daemon answered once the plugin had
	// stopped: "answers", or "gone: " and why not.
	AfterStop string `json:"afterStop,omitempty"`
	// Restart is the plugin started again (the launcher's way).
	Restart *mpsRestart `json:"restart,omitempty"`
	Cleanup mpsCleanup  `json:"cleanup"`
}

// mpsRestart is the plugin started again beside the running daemon.
type mpsRestart struct {
	// Adopted is the "adopted" of the new plugin's "MPS control daemon
	// up"; DaemonPid the pid file's after it.
	Adopted    bool    `json:"adopted"`
	DaemonPid  int     `json:"daemonPid"`
	DaemonUpMs float64 `json:"daemonUpMs"`
}

// part is one way's checks in the step, named after it.
type part struct {
	s   *Step
	way string
}

func (p part) check(name string, ok bool, detail string, args ...any) bool {
	return p.s.check(p.way+": "+name, ok, detail, args...)
}

func (p part) fail(name string, err error) { p.check(name, false, "%v", err) }

// mpsAlloc is one container's allocation in the limit test.
type mpsAlloc struct {
	Container string `json:"container"`
	AllocMiB  uint64 `json:"allocMiB"`
	CtxCreate *int   `json:"ctxCreate,omitempty"`
	MemAlloc  *int   `json:"memAlloc,omitempty"`
	// MemTotalMiB is what cuMemGetInfo said in the container's context.
	MemTotalMiB uint64 `json:"memTotalMiB,omitempty"`
}

// mpsCleanup is how the GPU was given back.
type mpsCleanup struct {
	// Done is what was done, in order.
	Done        []string `json:"done"`
	ComputeMode string   `json:"computeMode"`
	DirGone     bool     `json:"dirGone"`
	LastResort  bool     `json:"lastResort"`
}

// mpsShare is what k of a GPU's n replicas are worth: k/n of its threads
// (at least 1%) and of its memory in MiB, as the plugin must compute it.
func mpsShare(memoryBytes uint64, n, k int) (threadPercent int, mib uint64) {
	return max(100*k/n, 1), memoryBytes * uint64(k) / uint64(n) >> 20
}

// mpsWant is the answer an MPS replica's Allocate must give beyond the
// GPU itself: the mounts (host:container) and the environment.
func mpsWant(mpsRoot, uuid string, memoryBytes uint64, n, k int) (mounts []string, env map[string]string) {
	threads, mib := mpsShare(memoryBytes, n, k)
	dir := filepath.Join(mpsRoot, uuid)
	mounts = []string{filepath.Join(dir, "pipe") + ":" + mpsPipeMount, filepath.Join(dir, "shm") + ":" + mpsShmMount}
	env = map[string]string{mpsPipeEnv: mpsPipeMount, mpsThreadEnv: strconv.Itoa(threads)}
	if mib > 0 {
		env[mpsPinnedEnv] = fmt.Sprintf("0=%dM", mib)
	}
	return mounts, env
}

// mpsAnswerProblems says how a is not the answer wanted.
func mpsAnswerProblems(a answer, mounts []string, env map[string]string) []string {
	var bad []string
	for _, m := range mounts {
		if !slices.Contains(a.Mounts, m) {
			bad = append(bad, "no mount "+m)
		}
	}
	for k, v := range env {
		if got, ok := a.Envs[k]; !ok || got != v {
			bad = append(bad, fmt.Sprintf("%s=%q, want %q", k, got, v))
		}
	}
	if len(a.CDIDevices) == 0 {
		bad = append(bad, "no CDI device for the GPU")
	}
	slices.Sort(bad)
	return bad
}

// said reports whether the plugin's log entry e says msg about gpu, and when.
func said(e harness.LogEntry, msg, gpu string) (time.Time, bool) {
	if e.String("msg") != msg || e.String("gpu") != gpu {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, e.String("time"))
	return at, err == nil
}

// mpsGPU is the GPU to share: the first whole, healthy GPU served as
// nvidia.com/gpu.
func (c *checker) mpsGPU() *listedGPU {
	for i, g := range c.listed.GPUs {
		if !g.MIGEnabled && g.Resource == harness.ResourceName && g.Health == "Healthy" {
			return &c.listed.GPUs[i]
		}
	}
	return nil
}

// mpsPlugin is one run of the plugin with its own kubelet.
type mpsPlugin struct {
	k   *harness.Kubelet
	p   *harness.Plugin
	cdi string
	// name is how its checks call it.
	name string
}

func (m *mpsPlugin) stop() error {
	var err error
	if m.p != nil {
		err = m.p.Stop()
		m.p = nil
	}
	if m.k != nil {
		m.k.Stop()
		m.k = nil
	}
	return err
}

// startMPSPlugin starts the plugin as the serve step does, with its own
// kubelet and CDI folder under dir, the given MPS root and, when config
// is not empty, that config file, run as w says.
func (c *checker) startMPSPlugin(dir, mpsRoot, configFile string, w mpsWay) (*mpsPlugin, error) {
	m := &mpsPlugin{cdi: filepath.Join(dir, "cdi"), name: "the sharing plugin"}
	plugins := filepath.Join(dir, "plugins")
	for _, d := range []string{plugins, m.cdi} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	k, err := harness.StartKubelet(plugins, klog.Logger{})
	if err != nil {
		return nil, err
	}
	m.k = k
	args := []string{"--cdi-spec-dir", m.cdi, "--cdi-hook-path", c.hook, "--device-list-strategy", "cdi-cri", "--pod-resources-socket", "", "--mps-root", mpsRoot}
	if configFile != "" {
		args = append(args, "--config", configFile)
	}
	if w.launcher {
		args = append(args, "--mps-launcher-socket", mpsLauncherSocket(mpsRoot))
	}
	node := c.node
	m.p, err = harness.StartPlugin(harness.PluginOptions{Binary: c.plugin, PluginDir: plugins, Node: &node, Args: args, PIDNamespace: w.ownPID})
	if err != nil {
		m.stop()
		return nil, err
	}
	return m, nil
}

// mpsLauncherSocket is where the launcher listens, as the chart has it.
func mpsLauncherSocket(mpsRoot string) string { return filepath.Join(mpsRoot, "launcher.sock") }

// mps shares the first GPU through MPS in each of mpsWays: the daemon up
// before the replicas are offered, Allocate's mounts and limits,
// containers as MPS clients, what becomes of the daemon when the plugin
// stops (with the launcher: the plugin started again adopts it, and on a
// GPU one client's allocation beyond its share is refused while another
// holds its own), then the GPU given back: the daemon stopped by a plugin
// that shares nothing, the compute mode restored.
func (c *checker) mps(ctx context.Context, s *Step) {
	if c.served != nil {
		c.served.stop() // a node serves one kubelet API at a time
	}
	if c.listed == nil {
		s.fail("GPUs known", errors.New("the inventory step did not list the GPUs"))
		return
	}
	g := c.mpsGPU()
	if g == nil {
		s.Skipped = "no whole, healthy GPU served as " + harness.ResourceName + " to share through MPS"
		return
	}
	dir := filepath.Join(c.work, "mps")
	data := &mpsData{GPU: g.UUID, MemoryMiB: g.MemoryBytes >> 20, Replicas: mpsReplicas}
	s.Data = data
	defer func() { s.Notes = mpsNotes(data) }()
	data.ThreadPercentage, data.ShareMiB = mpsShare(g.MemoryBytes, mpsReplicas, 1)
	if !s.check("the GPU's memory is known", g.MemoryBytes > 0, "%d bytes in list -o json", g.MemoryBytes) {
		return
	}
	cfg := map[string]any{"sharing": map[string]any{"mps": config.MPS{FailRequestsGreaterThanOne: true, Resources: []config.SharedResource{
		{Name: harness.ResourceName, Replicas: mpsReplicas, Rename: mpsResource, Devices: []string{g.UUID}},
	}}}}
	configFile := filepath.Join(dir, "config.json")
	b, _ := json.Marshal(cfg)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.fail("work folders", err)
		return
	}
	if err := os.WriteFile(configFile, b, 0o644); err != nil {
		s.fail("config written", err)
		return
	}
	if c.mock {
		// The stand-in daemon leaves a file in the /dev/shm it was given,
		// which the containers must see on theirs. Its switch is a file in
		// the driver root: the daemon's environment is the plugin's own
		// making.
		marker := filepath.Join(c.node.DriverRoot, "etc", "mockmps", "shm-marker")
		if err := os.MkdirAll(filepath.Dir(marker), 0o755); err != nil {
			s.fail("the stand-in's switch", err)
			return
		}
		if err := os.WriteFile(marker, nil, 0o644); err != nil {
			s.fail("the stand-in's switch", err)
			return
		}
		defer os.RemoveAll(filepath.Dir(marker))
	}
	for _, w := range mpsWays {
		run := &mpsRun{Name: w.name, PIDNamespace: "host", Launcher: w.launcher, MPSRoot: filepath.Join(dir, w.name, "root")}
		if w.ownPID {
			run.PIDNamespace = "own"
		}
		data.Runs = append(data.Runs, run)
		c.mpsWay(ctx, part{s, w.name}, data, run, g, w, filepath.Join(dir, w.name), configFile)
		if cl := run.Cleanup; len(cl.Done) > 0 && (!cl.DirGone || !c.mock && cl.ComputeMode != "DEFAULT") {
			s.check("the GPU given back before it is shared another way", false, "%s", strings.Join(cl.Done, "; "))
			return
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// mpsWay shares g in the way w, with the MPS root and plugins under dir,
// and gives it back.
func (c *checker) mpsWay(ctx context.Context, p part, data *mpsData, run *mpsRun, g *listedGPU, w mpsWay, dir, configFile string) {
	var launcher *harness.Plugin
	if w.launcher {
		if err := os.MkdirAll(run.MPSRoot, 0o755); err != nil {
			p.fail("MPS root", err)
			return
		}
		var err error
		launcher, err = harness.StartLauncher(c.plugin, &c.node, "--mps-launcher-socket", mpsLauncherSocket(run.MPSRoot), "--mps-root", run.MPSRoot)
		if !p.check("mps-launcher starts in the host's PID namespace", err == nil, "%s", errText(err)) {
			return
		}
		// Stopped last: a plugin that shares nothing stops the daemon
		// through its control client, without the launcher.
		defer func() {
			err := launcher.Stop()
			data.PluginLog = append(data.PluginLog, mpsLogLines(launcher.Log())...)
			run.Cleanup.Done = append(run.Cleanup.Done, "launcher stopped")
			p.check("mps-launcher stops cleanly", err == nil, "%s", errText(err))
		}()
	}
	m, err := c.startMPSPlugin(filepath.Join(dir, "shared"), run.MPSRoot, configFile, w)
	if !p.check("plugin starts sharing the GPU through MPS", err == nil, "%s", errText(err)) {
		return
	}
	// Whatever happens from here, the GPU is given back.
	defer func() { c.mpsCleanup(p, data, run, m) }()
	if !c.mpsShared(ctx, p, data, run, g, m, w.launcher) {
		return
	}
	pidFile := filepath.Join(run.MPSRoot, g.UUID, "pipe", "nvidia-cuda-mps-control.pid")
	pid, err := readPid(pidFile)
	run.DaemonPid = pid
	p.check("the daemon's pid file", err == nil, "%d %s", pid, errText(err))
	c.mpsStop(p, data, m)

	_, cerr := c.mpsControl(ctx, run.MPSRoot, g.UUID, "get_default_active_thread_percentage")
	run.AfterStop = "answers"
	if cerr != nil {
		run.AfterStop = "gone: " + oneLine(cerr.Error(), 300)
	}
	if w.ownPID && !w.launcher {
		// As a pod without hostPID: the daemon was in the plugin's PID
		// namespace, which ends with its first process.
		p.check("the daemon ended with the plugin's PID namespace", cerr != nil, "%s", run.AfterStop)
		return
	}
	alive := pid > 0 && exists(filepath.Join("/proc", strconv.Itoa(pid)))
	if !p.check("the daemon outlives the plugin (answers, its pid runs)", cerr == nil && alive, "pid %d running %v; %s", pid, alive, run.AfterStop) || !w.launcher {
		return
	}

	// The plugin restarted, as a new pod of the DaemonSet: it must adopt
	// the launcher's daemon, not start another.
	next, err := c.startMPSPlugin(filepath.Join(dir, "again"), run.MPSRoot, configFile, w)
	if !p.check("plugin starts again", err == nil, "%s", errText(err)) {
		return
	}
	next.name = "the plugin started again"
	m = next
	wait, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	e, err := m.p.WaitLog(wait, fmt.Sprintf("%q about %s", mpsDaemonUp, g.UUID), func(e harness.LogEntry) bool {
		_, ok := said(e, mpsDaemonUp, g.UUID)
		return ok
	})
	if err != nil {
		p.fail("plugin started again says the daemon is up", fmt.Errorf("%w; plugin log: %s", err, oneLine(m.p.Log(), 1500)))
		return
	}
	up, _ := said(e, mpsDaemonUp, g.UUID)
	again, perr := readPid(pidFile)
	run.Restart = &mpsRestart{Adopted: e.String("adopted") == "true", DaemonPid: again, DaemonUpMs: harness.Millis(up.Sub(m.p.Started))}
	p.check("plugin started again adopts the daemon (adopted=true, same pid)", run.Restart.Adopted && perr == nil && again == pid,
		"adopted=%s, pid %d then %d %s", e.String("adopted"), pid, again, errText(perr))
}

// readPid reads a pid file.
func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return pid, nil
}

// mpsShared checks the plugin m sharing g, with the limit test when
// limit is set, and returns whether its daemon answered.
func (c *checker) mpsShared(ctx context.Context, s part, data *mpsData, run *mpsRun, g *listedGPU, m *mpsPlugin, limit bool) bool {
	failed := func(name string, err error) {
		s.fail(name, fmt.Errorf("%w; plugin log: %s", err, oneLine(m.p.Log(), 1500)))
	}
	wait, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	ep, err := m.k.WaitConnected(wait, mpsResource)
	if err != nil {
		failed(mpsResource+" registers", err)
		return false
	}
	s.check(mpsResource+" registers", true, "")
	run.RegisteredMs = harness.Millis(ep.ConnectedAt.Sub(m.p.Started))
	list, err := m.k.WaitDevices(wait, mpsResource, "every replica healthy", func(l harness.List) bool {
		return len(l.Devices) == mpsReplicas && len(l.Healthy()) == mpsReplicas
	})
	if err != nil {
		failed("both replicas healthy (offered once the daemon answers)", err)
		return false
	}
	s.check("both replicas healthy (offered once the daemon answers)", true, "%v", list.Healthy())
	run.SharesOfferedMs = harness.Millis(list.ReceivedAt.Sub(m.p.Started))
	// The line is written before the shares are offered, but the harness
	// copies the plugin's output on its own goroutine: wait for it.
	e, err := m.p.WaitLog(wait, fmt.Sprintf("%q about %s", mpsDaemonUp, g.UUID), func(e harness.LogEntry) bool {
		_, ok := said(e, mpsDaemonUp, g.UUID)
		return ok
	})
	up, _ := said(e, mpsDaemonUp, g.UUID)
	if s.check("the plugin says its daemon is up", err == nil, "%s", errText(err)) {
		run.DaemonUpMs = harness.Millis(up.Sub(m.p.Started))
		run.UpToOfferedMs = harness.Millis(list.ReceivedAt.Sub(up))
		s.check("daemon up before its shares are offered", !list.ReceivedAt.Before(up), "up at %.1f ms, offered at %.1f ms", run.DaemonUpMs, run.SharesOfferedMs)
	}

	gpuDir := filepath.Join(run.MPSRoot, g.UUID)
	entries, err := os.ReadDir(filepath.Join(gpuDir, "pipe"))
	for _, e := range entries {
		run.PipeFiles = append(run.PipeFiles, e.Name())
	}
	if c.mock {
		s.check("the pipe directory holds the daemon's control socket", slices.Contains(run.PipeFiles, "control"), "%v %s", run.PipeFiles, errText(err))
	} else {
		s.check("the pipe directory holds the daemon's files", len(run.PipeFiles) > 0, "%v %s", run.PipeFiles, errText(err))
	}
	said, err := c.mpsControl(ctx, run.MPSRoot, g.UUID, "get_default_active_thread_percentage")
	run.DaemonThreads = said
	pct, perr := strconv.ParseFloat(said, 64)
	answered := s.check("the daemon answers its control client with one share's threads", err == nil && perr == nil && int(pct) == data.ThreadPercentage,
		"%q, want %d (%s)", said, data.ThreadPercentage, errText(err))
	if b, err := os.ReadFile(filepath.Join(gpuDir, "log", "control.log")); err == nil {
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		run.ControlLog = lines[max(0, len(lines)-20):]
		if c.mock {
			// The stand-in records each command; the real daemon's log
			// format is its own.
			want := []string{fmt.Sprintf("set_default_active_thread_percentage %d", data.ThreadPercentage), fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", data.ShareMiB)}
			s.check("the daemon was given one share's limits", subset(want, lines), "told %v, want %v", lines, want)
		}
	} else if c.mock {
		s.fail("the daemon was given one share's limits", err)
	}
	if c.mock {
		// The mock NVML keeps a compute mode in the process that set it,
		// so this process cannot read the plugin's; its log says whether
		// setting it failed.
		run.ComputeMode = "not readable here (the mock NVML keeps it per process)"
		s.check("the plugin set the compute mode without a warning", !strings.Contains(m.p.Log(), mpsModeFailed), "%s", logLines(m.p.Log(), mpsModeFailed))
	} else {
		mode, err := c.computeMode(g.UUID)
		run.ComputeMode = modeName(mode)
		s.check("compute mode EXCLUSIVE_PROCESS", err == nil && mode == gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS, "%s %s", run.ComputeMode, errText(err))
	}

	// Two containers, one replica each.
	mounts, env := mpsWant(run.MPSRoot, g.UUID, g.MemoryBytes, mpsReplicas, 1)
	ids := slices.Sorted(func(yield func(string) bool) {
		for id := range list.Devices {
			if !yield(id) {
				return
			}
		}
	})
	var resps []*api.ContainerAllocateResponse
	for i, id := range ids {
		resp, err := ep.Allocate(wait, id)
		name := fmt.Sprintf("Allocate of replica %d", i+1)
		if !s.check(name, err == nil, "%s %s", id, errText(err)) {
			continue
		}
		a := answerOf(resp)
		run.Answers = append(run.Answers, a)
		resps = append(resps, resp)
		bad := mpsAnswerProblems(a, mounts, env)
		s.check(name+": the daemon's mounts and one share's limits", len(bad) == 0, "%s", strings.Join(bad, "; "))
	}
	_, err = ep.Allocate(wait, ids...)
	s.check("Allocate of two replicas for one container refused (failRequestsGreaterThanOne)", err != nil, "answered %v", ids)
	if len(resps) == mpsReplicas {
		c.mpsContainers(ctx, s, data, run, g, m, resps, limit)
	}
	return answered
}

// mpsContainers runs the probe as MPS clients with what Allocate
// answered. On a GPU, A takes half its share; in the limit test it holds
// it while B tries its own: one and a quarter of its share (refused),
// then half (granted). On the mock, A only lists its mounts.
func (c *checker) mpsContainers(ctx context.Context, s part, data *mpsData, run *mpsRun, g *listedGPU, m *mpsPlugin, resps []*api.ContainerAllocateResponse, limit bool) {
	rootfs, err := c.image(debian)
	if !s.check("image builds", err == nil, "%s", errText(err)) {
		return
	}
	shm := filepath.Join(run.MPSRoot, g.UUID, "shm")
	// A file the containers must find on their /dev/shm: the GPU's.
	if err := os.WriteFile(filepath.Join(shm, mpsShmMarker), nil, 0o644); err != nil {
		s.fail("marker in the GPU's shared memory directory", err)
		return
	}
	defer os.Remove(filepath.Join(shm, mpsShmMarker))
	half, over := data.ShareMiB/2, data.ShareMiB*5/4
	probe := func(name string, resp *api.ContainerAllocateResponse, mib uint64, hold bool) (*held, *probeReport) {
		x := mpsExtras(resp)
		x.env = append(x.env, "CUDAPROBE_LIST="+mpsPipeMount+":"+mpsShmMount)
		if mib > 0 {
			x.env = append(x.env, fmt.Sprintf("CUDAPROBE_ALLOC_MIB=%d", mib))
		}
		names := answerOf(resp).CDIDevices
		id := fmt.Sprintf("mps-%s-%d", strings.ReplaceAll(name, " ", "-"), time.Now().UnixNano())
		began := time.Now()
		cr := &containerRun{Image: debian.Name, GPUs: []string{g.UUID}, CDI: names}
		run.Containers = append(run.Containers, cr)
		defer func() { cr.Seconds = roundSeconds(time.Since(began)) }()
		var h *held
		var out, stderr string
		if hold {
			h, out, err = c.startHeld(ctx, rootfs, m.cdi, names, id, x)
		} else {
			out, stderr, err = c.runContainer(ctx, rootfs, m.cdi, names, id, x)
			cr.Stderr = oneLine(stderr, 2000)
		}
		if !s.check(name+": runc runs it", err == nil, "%s", errText(err)) {
			return nil, nil
		}
		p, err := parseProbe(out)
		if !s.check(name+": probe answers", err == nil, "%s", errText(err)) {
			if h != nil {
				cr.Stderr = oneLine(h.release(), 2000)
			}
			return nil, nil
		}
		cr.Probe = p
		if limit && mib > 0 {
			data.Limit = append(data.Limit, mpsAlloc{Container: name, AllocMiB: mib, CtxCreate: p.CtxCreate, MemAlloc: p.MemAlloc, MemTotalMiB: p.MemTotalMiB})
		}
		return h, p
	}

	aMiB := half
	if c.mock {
		aMiB = 0
		if limit {
			data.LimitSkipped = mpsLimitNotRun
		}
	}
	h, a := probe("container A", resps[0], aMiB, limit)
	if a == nil {
		return
	}
	if h != nil {
		defer func() { run.Containers[0].Stderr = oneLine(h.release(), 2000) }()
	}
	c.judgeProbe(s.s, s.way+": container A", a, []string{g.UUID})
	s.check("container A: "+mpsPipeMount+" holds the daemon's control socket", slices.Contains(a.Listed[mpsPipeMount], "control"),
		"%v %s", a.Listed[mpsPipeMount], a.ListErrors[mpsPipeMount])
	s.check("container A: "+mpsShmMount+" is the GPU's shared memory directory", slices.Contains(a.Listed[mpsShmMount], mpsShmMarker),
		"%v %s (want %s, written there on the host)", a.Listed[mpsShmMount], a.ListErrors[mpsShmMount], mpsShmMarker)
	if c.mock {
		s.check("container A: "+mpsShmMount+" is the daemon's too", slices.ContainsFunc(a.Listed[mpsShmMount], func(n string) bool { return strings.HasPrefix(n, "mockmps.") }),
			"%v (the stand-in daemon's mockmps.<pid>)", a.Listed[mpsShmMount])
		return
	}
	if !s.check(fmt.Sprintf("container A: cuMemAlloc of %d MiB, half its share of %d MiB", half, data.ShareMiB), a.CtxCreate != nil && *a.CtxCreate == 0 && a.MemAlloc != nil && *a.MemAlloc == 0,
		"cuCtxCreate %v, cuMemAlloc %v %s", deref(a.CtxCreate), deref(a.MemAlloc), a.AllocError) || !limit {
		return
	}
	_, b := probe("container B", resps[1], over, false)
	if b != nil {
		s.check(fmt.Sprintf("container B: cuMemAlloc of %d MiB, 1.25× its share, refused with CUDA_ERROR_OUT_OF_MEMORY while A holds %d MiB", over, half),
			b.CtxCreate != nil && *b.CtxCreate == 0 && b.MemAlloc != nil && *b.MemAlloc == cudaOutOfMemory,
			"cuCtxCreate %v, cuMemAlloc %v %s; the client saw %d MiB total", deref(b.CtxCreate), deref(b.MemAlloc), b.AllocError, b.MemTotalMiB)
	}
	_, b = probe("container B again", resps[1], half, false)
	if b != nil {
		s.check(fmt.Sprintf("container B again: cuMemAlloc of %d MiB, half its share, granted", half),
			b.CtxCreate != nil && *b.CtxCreate == 0 && b.MemAlloc != nil && *b.MemAlloc == 0,
			"cuCtxCreate %v, cuMemAlloc %v %s", deref(b.CtxCreate), deref(b.MemAlloc), b.AllocError)
	}
}

// mpsNotes are the summary's lines about the step: the share, a line
// per way and how the GPU was given back, and the limit test.
func mpsNotes(d *mpsData) []string {
	notes := []string{fmt.Sprintf("%s as %d × %s: %d%% of its threads and %d MiB of its %d MiB each",
		d.GPU, d.Replicas, mpsResource, d.ThreadPercentage, d.ShareMiB, d.MemoryMiB)}
	for _, r := range d.Runs {
		how := "plugin in the host's PID namespace starts the daemon"
		switch {
		case r.Launcher:
			how = "plugin in a PID namespace of its own, mps-launcher in the host's starts the daemon"
		case r.PIDNamespace == "own":
			how = "plugin in a PID namespace of its own starts the daemon"
		}
		line := fmt.Sprintf("%s (%s): registered %.0f ms, daemon up %.0f ms, shares offered %.0f ms after start (daemon up → shares offered %.1f ms); pipe directory: %s; daemon's default thread percentage %q; compute mode while shared: %s; daemon pid %d",
			r.Name, how, r.RegisteredMs, r.DaemonUpMs, r.SharesOfferedMs, r.UpToOfferedMs, strings.Join(r.PipeFiles, ", "), r.DaemonThreads, r.ComputeMode, r.DaemonPid)
		if r.AfterStop != "" {
			line += "; once the plugin stopped, the daemon " + r.AfterStop
		}
		if rs := r.Restart; rs != nil {
			line += fmt.Sprintf("; plugin started again: daemon up %.0f ms after start, adopted=%v, pid %d", rs.DaemonUpMs, rs.Adopted, rs.DaemonPid)
		}
		notes = append(notes, line)
		if c := r.Cleanup; len(c.Done) > 0 {
			notes = append(notes, fmt.Sprintf("%s given back: %s; directory gone %v; compute mode %s; last resort %v", r.Name, strings.Join(c.Done, "; "), c.DirGone, c.ComputeMode, c.LastResort))
		}
	}
	if d.LimitSkipped != "" {
		notes = append(notes, "limit test: "+d.LimitSkipped)
	} else if len(d.Limit) > 0 {
		var l []string
		for _, a := range d.Limit {
			l = append(l, fmt.Sprintf("%s %d MiB → cuCtxCreate %v, cuMemAlloc %v (client saw %d MiB total)", a.Container, a.AllocMiB, deref(a.CtxCreate), deref(a.MemAlloc), a.MemTotalMiB))
		}
		notes = append(notes, fmt.Sprintf("limit test (launcher; share %d MiB): %s", d.ShareMiB, strings.Join(l, "; ")))
	}
	return notes
}

// mpsExtras are the environment and mounts of Allocate's answer, as
// containerd gives them to a container.
func mpsExtras(resp *api.ContainerAllocateResponse) extras {
	var x extras
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range resp.Envs {
			if !yield(k) {
				return
			}
		}
	}) {
		x.env = append(x.env, k+"="+resp.Envs[k])
	}
	for _, m := range resp.Mounts {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		x.mounts = append(x.mounts, oci.Mount{Destination: m.ContainerPath, Source: m.HostPath, Type: "bind", Options: opts})
	}
	return x
}

// mpsCleanup gives the GPU back, whatever happened before: the sharing
// plugin stopped if it still runs (its daemon may outlive it), then a
// plugin that shares nothing run on the same MPS root until it serves,
// which stops the daemon and restores the compute mode; as a last resort,
// the daemon told quit through its control client and the compute mode
// set here. Each part has its own deadline, not the step's context: an
// interrupted run still gives the GPU back.
func (c *checker) mpsCleanup(s part, data *mpsData, run *mpsRun, m *mpsPlugin) {
	cl := &run.Cleanup
	c.mpsStop(s, data, m)
	cl.Done = append(cl.Done, "sharing plugin stopped")

	uuid := data.GPU
	gpuDir := filepath.Join(run.MPSRoot, uuid)
	said, err := c.mpsSweep(run.MPSRoot)
	data.PluginLog = append(data.PluginLog, mpsLogLines(said)...)
	if err == nil {
		cl.Done = append(cl.Done, "plugin sharing nothing served "+harness.ResourceName+" on the same MPS root")
	} else {
		cl.Done = append(cl.Done, "plugin sharing nothing did not serve on the same MPS root")
	}
	if s.check("a plugin sharing nothing serves on the same MPS root", err == nil, "%s", errText(err)) {
		s.check("the plugin sharing nothing says it stopped the daemon, and no compute-mode warning",
			strings.Contains(said, "MPS control daemon stopped") && !strings.Contains(said, mpsModeFailed), "%s", logLines(said, "MPS control daemon"))
	}

	mode, merr := c.computeMode(uuid)
	gone := !exists(gpuDir)
	if !gone || !c.mock && (merr != nil || mode != gonvml.COMPUTEMODE_DEFAULT) {
		cl.LastResort = true
		c.mpsLastResort(data, run, gpuDir)
		mode, merr = c.computeMode(uuid)
		gone = !exists(gpuDir)
	}
	cl.DirGone = gone
	s.check("the GPU's MPS directory is gone", gone, "%s", gpuDir)
	if c.mock {
		cl.ComputeMode = run.ComputeMode
	} else {
		cl.ComputeMode = modeName(mode)
		s.check("compute mode DEFAULT again", merr == nil && mode == gonvml.COMPUTEMODE_DEFAULT, "%s %s", cl.ComputeMode, errText(merr))
	}
	s.check("given back without the last resort", !cl.LastResort, "%s", strings.Join(cl.Done, "; "))
}

// mpsStop stops the plugin m and its kubelet, if it still runs, and keeps
// its log's lines about MPS.
func (c *checker) mpsStop(s part, data *mpsData, m *mpsPlugin) {
	p := m.p
	if p == nil {
		m.stop()
		return
	}
	err := m.stop()
	data.PluginLog = append(data.PluginLog, mpsLogLines(p.Log())...)
	s.check(m.name+" stops cleanly", err == nil, "%s", errText(err))
}

// mpsSweep runs the plugin sharing nothing on mpsRoot until it serves
// nvidia.com/gpu (it stops the daemons it finds there first), and returns
// its log.
func (c *checker) mpsSweep(mpsRoot string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	next, err := c.startMPSPlugin(filepath.Join(filepath.Dir(mpsRoot), "unshared"), mpsRoot, "", mpsWay{})
	if err != nil {
		return "", err
	}
	go func() {
		// A plugin that exits will not register.
		select {
		case <-next.p.Exited():
			cancel()
		case <-ctx.Done():
		}
	}()
	_, err = next.k.WaitConnected(ctx, harness.ResourceName)
	said := next.p.Log()
	serr := next.stop()
	if err != nil {
		return said, fmt.Errorf("%w; plugin log: %s", err, oneLine(said, 1500))
	}
	return said, serr
}

// mpsLastResort tells the GPU's daemon quit through its control client
// (the plugin's helper, else the driver's program run directly) and sets
// the compute mode DEFAULT through NVML here. The directory is removed
// only once the daemon answered: while it may run, it is how a person
// reaches it, and the work folder is kept.
func (c *checker) mpsLastResort(data *mpsData, run *mpsRun, gpuDir string) {
	cl := &run.Cleanup
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	said, err := c.mpsControl(ctx, run.MPSRoot, data.GPU, "quit")
	cl.Done = append(cl.Done, fmt.Sprintf("last resort: quit through the control client: %q %s", said, errText(err)))
	if err != nil {
		said, err = c.mpsControlDirect(ctx, run.MPSRoot, data.GPU, "quit")
		cl.Done = append(cl.Done, fmt.Sprintf("last resort: quit through the control program run directly: %q %s", said, errText(err)))
	}
	if err == nil {
		if rerr := os.RemoveAll(gpuDir); rerr != nil {
			cl.Done = append(cl.Done, "last resort: removing "+gpuDir+": "+rerr.Error())
		}
	} else if exists(gpuDir) {
		c.keepWork = fmt.Sprintf("the MPS control daemon of %s may still run; stop it with: echo quit | CUDA_MPS_PIPE_DIRECTORY=%s %s",
			data.GPU, filepath.Join(gpuDir, "pipe"), filepath.Join(c.node.DriverRoot, mpsexec.DefaultBinary))
		cl.Done = append(cl.Done, "work folder kept: "+c.keepWork)
	}
	if c.mock {
		return // this process's mock NVML is not the plugin's
	}
	lib, err := c.nvml()
	if err == nil {
		err = nvml.SetComputeMode(lib, data.GPU, false)
	}
	cl.Done = append(cl.Done, "last resort: compute mode DEFAULT set through NVML "+errText(err))
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, os.ErrNotExist)
}

// mpsControl sends one command to the GPU's daemon through the driver's
// control client, run as the plugin runs it (its mps-exec helper:
// confined to the driver root, with the GPU's pipe and log directories),
// and returns its answer.
func (c *checker) mpsControl(ctx context.Context, mpsRoot, uuid, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	spec, err := mpsexec.Locate(c.node.DriverRoot)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(mpsRoot, uuid)
	spec.DevRoot, spec.Pipe, spec.Log, spec.Shm = c.node.DevRoot, filepath.Join(dir, "pipe"), filepath.Join(dir, "log"), filepath.Join(dir, "shm")
	spec.Env = append(spec.Env, "CUDA_VISIBLE_DEVICES="+uuid)
	cmd, err := mpsexec.Command(ctx, c.plugin, spec)
	if err != nil {
		return "", err
	}
	cmd.Stdin = strings.NewReader(command + "\n")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, oneLine(string(ee.Stderr), 600))
		}
		return strings.TrimSpace(string(out)), fmt.Errorf("%s through %s %s: %w", command, filepath.Base(c.plugin), mpsexec.HelperCommand, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// mpsControlDirect is mpsControl without the plugin's helper: the
// driver's control program run here, reaching the daemon's socket through
// the host's view of the pipe directory.
func (c *checker) mpsControlDirect(ctx context.Context, mpsRoot, uuid, command string) (string, error) {
	spec, err := mpsexec.Locate(c.node.DriverRoot)
	if err != nil {
		return "", err
	}
	bin := spec.Binary
	if spec.DriverRoot != "" {
		bin = filepath.Join(spec.DriverRoot, spec.Binary)
	}
	dir := filepath.Join(mpsRoot, uuid)
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(append(os.Environ(), spec.Env...), "CUDA_VISIBLE_DEVICES="+uuid,
		"CUDA_MPS_PIPE_DIRECTORY="+filepath.Join(dir, "pipe"), "CUDA_MPS_LOG_DIRECTORY="+filepath.Join(dir, "log"))
	cmd.Stdin = strings.NewReader(command + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return strings.TrimSpace(string(out)), fmt.Errorf("%s through %s: %w", command, bin, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// computeMode reads the GPU's compute mode through NVML in this process.
func (c *checker) computeMode(uuid string) (gonvml.ComputeMode, error) {
	lib, err := c.nvml()
	if err != nil {
		return 0, err
	}
	h, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return 0, fmt.Errorf("GPU %s: %w", uuid, ret)
	}
	mode, ret := h.GetComputeMode()
	if ret != gonvml.SUCCESS {
		return 0, fmt.Errorf("GPU %s: reading its compute mode: %w", uuid, ret)
	}
	return mode, nil
}

func modeName(m gonvml.ComputeMode) string {
	switch m {
	case gonvml.COMPUTEMODE_DEFAULT:
		return "DEFAULT"
	case gonvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return "EXCLUSIVE_THREAD"
	case gonvml.COMPUTEMODE_PROHIBITED:
		return "PROHIBITED"
	case gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return "EXCLUSIVE_PROCESS"
	}
	return fmt.Sprintf("mode %d", m)
}

// mpsLogLines are a plugin log's lines about MPS, and its warnings and
// errors, at most 40.
func mpsLogLines(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "MPS") || strings.Contains(l, "mps") || strings.Contains(l, `"level":"WARN"`) || strings.Contains(l, `"level":"ERROR"`) {
			out = append(out, l)
		}
	}
	return out[max(0, len(out)-40):]
}

// logLines are the lines of log that hold what, bounded.
func logLines(log, what string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, what) {
			out = append(out, l)
		}
	}
	return oneLine(strings.Join(out, " | "), 1000)
}
