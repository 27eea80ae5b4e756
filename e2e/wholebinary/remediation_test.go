package wholebinary

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/cuda/cudatest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources/podresourcestest"
)

// The remediation lane: the real binary with remediation.enabled on the
// mock DGX H100, resetting GPU 3 through the mock NVML's drain, remove and
// rediscover, and proving it with the confined CUDA probe on the mock
// libcuda. Who holds a GPU comes from a fake PodResources API.

// sick is the GPU every scenario faults.
const sick = 3

// remProfile has eight Hopper GPUs on NVSwitches: each is reset alone.
const remProfile = "dgx-h100"

// remNode is a node with remediation on.
type remNode struct {
	*node
	path     string // the profile's
	args     []string
	pods     *podresourcestest.Server
	stateDir string
	// drainState is the mock NVML's MOCK_NVML_DRAIN_STATE: the GPUs the
	// driver holds draining or removed, kept across the plugin's restarts
	// as a node's driver keeps them.
	drainState string
	env        []string
	// cudaConf is the mock libcuda's mockcuda.conf; gpuLines its GPUs.
	cudaConf string
	gpuLines []string
	metrics  string // host:port of the running plugin's /metrics
}

// needRoot skips a test that needs root, except under CI, as the
// container lane does.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	const why = "root: the CUDA probe runs in new namespaces, and the GPUs' /dev nodes are made with mknod"
	if os.Getenv("CI") != "" {
		t.Fatal("the remediation lane needs " + why + "; CI is set")
	}
	t.Skip("needs " + why)
}

// startRemediation starts the plugin with remediation on, a state dir, a
// PodResources API, and a driver root whose mock libcuda knows the
// profile's GPUs, then cudaConf's lines.
func startRemediation(t *testing.T, cudaConf ...string) *remNode {
	t.Helper()
	needRoot(t)
	path, err := harness.ProfilePath(remProfile)
	if err != nil {
		t.Fatal(err)
	}
	prof, err := mocknvml.LoadProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := &remNode{path: path, stateDir: t.TempDir(), pods: podresourcestest.Start(t)}
	r.drainState = filepath.Join(t.TempDir(), "drain-state")
	r.env = []string{"MOCK_NVML_DRAIN_STATE=" + r.drainState}
	for _, g := range prof.GPUs {
		r.gpuLines = append(r.gpuLines, fmt.Sprintf("gpu %d %s %s", g.Minor, g.BusID, g.UUID))
	}
	driverRoot, libDir := cudatest.DriverRoot(t, strings.Join(append(slices.Clone(r.gpuLines), cudaConf...), "\n")+"\n")
	r.cudaConf = filepath.Join(libDir, "mockcuda.conf")
	r.args = []string{
		"--remediation-enabled=true",
		"--remediation-usage-poll", "100ms",
		"--state-dir", r.stateDir,
		"--pod-resources-socket", r.pods.Socket,
		"--driver-root", driverRoot,
		"--dev-root", devRoot(t, prof),
		"--metrics-address", "127.0.0.1:0",
	}
	r.node = startNodeEnv(t, remProfile, library, r.env, r.args...)
	r.metrics = metricsAddress(t, r.p)
	return r
}

// devRoot makes a /dev whose nodes are character devices, as the probe
// binds only those: the GPUs', nvidiactl, the UVM nodes and null, each
// 1:3 (/dev/null's numbers) as the cluster fixture makes them.
func devRoot(t *testing.T, prof *mocknvml.Profile) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "dev")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	names := []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "null"}
	for _, g := range prof.GPUs {
		names = append(names, fmt.Sprintf("nvidia%d", g.Minor))
	}
	for _, name := range names {
		if err := unix.Mknod(filepath.Join(dir, name), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// metricsAddress is where p serves /metrics, from its log.
func metricsAddress(t *testing.T, p *harness.Plugin) string {
	t.Helper()
	e, err := p.WaitLog(ctx(t), "metrics address", func(e harness.LogEntry) bool { return e.String("msg") == "serving metrics" })
	if err != nil {
		t.Fatal(err)
	}
	return e.String("address")
}

// restart SIGKILLs the plugin, calls between, and starts it again on the
// same node: the same state dir, PodResources, driver root and /dev. The
// mock NVML starts afresh with the new process, but for the GPUs the old
// one left draining or removed (MOCK_NVML_DRAIN_STATE), as a driver keeps
// them. It returns the new plugin's first list.
func (r *remNode) restart(t *testing.T, between func()) harness.List {
	t.Helper()
	seq := 0
	if l, ok := r.k.Devices(harness.ResourceName); ok {
		seq = l.Seq
	}
	if err := r.p.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.k.WaitStats(ctx(t), "the killed plugin disconnected", func(s harness.Stats) bool { return s.Connected == 0 }); err != nil {
		t.Fatal(err)
	}
	between()
	r.p = startPluginEnv(t, library, r.path, r.k.Dir(), r.env, r.args...)
	l, err := r.k.WaitDevices(ctx(t), harness.ResourceName, "a list from the new plugin", func(l harness.List) bool { return l.Seq > seq })
	if err != nil {
		t.Fatal(err)
	}
	r.metrics = metricsAddress(t, r.p)
	return l
}

// pauseReset makes the mock NVML stop the plugin's next removal or
// rediscovery of GPU i, and returns a func that waits until it is stopped.
func (r *remNode) pauseReset(t *testing.T, i int, at mocknvml.ResetStep) (wait func()) {
	t.Helper()
	if err := r.p.Control().PauseReset(i, at); err != nil {
		t.Fatal(err)
	}
	// A test that fails with the reset stopped lets it go on, so the
	// plugin can stop; after a kill there is nothing to resume.
	p := r.p
	t.Cleanup(func() { _ = p.Control().ResumeReset(i) })
	return func() {
		t.Helper()
		if err := r.p.Control().WaitResetPaused(ctx(t), i); err != nil {
			t.Fatalf("the plugin's reset of GPU %d did not stop in its %s: %v", i, at, err)
		}
	}
}

// drainStateSays is the mock NVML's MOCK_NVML_DRAIN_STATE without its
// comments: what the driver holds draining or removed.
func (r *remNode) drainStateSays(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(r.drainState)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for l := range strings.Lines(string(b)) {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// inject sends commands to the mock NVML.
func (r *remNode) inject(t *testing.T, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if err := r.p.Inject(c); err != nil {
			t.Fatalf("%s: %v", c, err)
		}
	}
}

// hold makes the PodResources API list a pod holding each GPU of idx
// (none: no pod).
func (r *remNode) hold(idx ...int) {
	var pods []*podresourcesv1.PodResources
	for _, i := range idx {
		pods = append(pods, podresourcestest.Pod("default", fmt.Sprintf("train-%d", i),
			podresourcestest.Container("main", podresourcestest.Devices(harness.ResourceName, r.uuid(i)))))
	}
	r.pods.Set(pods...)
}

// waitHealth waits until the kubelet's list has GPU i with health.
func (r *remNode) waitHealth(t *testing.T, i int, health string) harness.List {
	t.Helper()
	l, err := r.k.WaitDevices(ctx(t), harness.ResourceName, fmt.Sprintf("GPU %d %s", i, health), harness.DeviceHealth(r.uuid(i), health))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waitTransition waits for the plugin's log line of GPU i's remediation
// going from one state to another and returns it.
func (r *remNode) waitTransition(t *testing.T, i int, from, to string) harness.LogEntry {
	t.Helper()
	id := r.uuid(i)
	e, err := r.p.WaitLog(ctx(t), fmt.Sprintf("GPU %d's remediation %s -> %s", i, from, to), func(e harness.LogEntry) bool {
		return e.String("msg") == "remediation" && e.String("gpu") == id && e.String("from") == from && e.String("to") == to
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// waitLog waits for a log line with msg about GPU i.
func (r *remNode) waitLog(t *testing.T, i int, msg string) harness.LogEntry {
	t.Helper()
	id := r.uuid(i)
	e, err := r.p.WaitLog(ctx(t), fmt.Sprintf("%q for GPU %d", msg, i), func(e harness.LogEntry) bool {
		return e.String("msg") == msg && e.String("gpu") == id
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// count is how many lines of the running plugin's log have msg.
func (r *remNode) count(msg string) int {
	n := 0
	for _, e := range r.p.LogEntries() {
		if e.String("msg") == msg {
			n++
		}
	}
	return n
}

// transitions are GPU i's remediation states, as the running plugin's log
// says they changed: the first state, then each it went to.
func (r *remNode) transitions(i int) []string {
	var out []string
	for _, e := range r.p.LogEntries() {
		if e.String("msg") != "remediation" || e.String("gpu") != r.uuid(i) {
			continue
		}
		if len(out) == 0 {
			out = append(out, e.String("from"))
		}
		out = append(out, e.String("to"))
	}
	return out
}

// savedGPU is one GPU of remediation.json.
type savedGPU struct {
	UUID   string      `json:"uuid"`
	State  string      `json:"state"`
	Reason string      `json:"reason"`
	Resets []time.Time `json:"resets"`
}

// saved reads GPU i's remediation from remediation.json; ok is false when
// the file does not name it (a GPU serving with no reset is left out).
func (r *remNode) saved(t *testing.T, i int) (g savedGPU, ok bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(r.stateDir, "remediation.json"))
	if err != nil {
		t.Fatalf("remediation.json: %v", err)
	}
	var f struct {
		BootID string `json:"bootID"`
		State  struct {
			GPUs []savedGPU `json:"gpus"`
		} `json:"state"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("remediation.json: %v\n%s", err, b)
	}
	for _, s := range f.State.GPUs {
		if s.UUID == r.uuid(i) {
			return s, true
		}
		t.Errorf("remediation.json names GPU %s, which no scenario faulted:\n%s", s.UUID, b)
	}
	return savedGPU{}, false
}

// mustSaved is saved, failing when GPU i is not in the file.
func (r *remNode) mustSaved(t *testing.T, i int) savedGPU {
	t.Helper()
	g, ok := r.saved(t, i)
	if !ok {
		t.Fatalf("remediation.json does not name GPU %d", i)
	}
	return g
}

// metric is the value of the series name with labels on the running
// plugin's /metrics; 0 when there is none.
func (r *remNode) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	fam := fams[name]
	if fam == nil {
		return 0
	}
	for _, m := range fam.GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return 0
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// wantMetrics checks the remediation's counters: resets by result,
// recoveries, and GPU i's state.
// The service records a command's metrics after the log line a test waits
// for, so the figures are read until they match, within waitTimeout.
func (r *remNode) wantMetrics(t *testing.T, i int, success, failure, recoveries float64, state string) {
	t.Helper()
	want := []float64{success, failure, recoveries, 1}
	var got []float64
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		got = []float64{
			r.metric(t, "gpu_device_plugin_remediation_resets_total", map[string]string{"result": "success"}),
			r.metric(t, "gpu_device_plugin_remediation_resets_total", map[string]string{"result": "failure"}),
			r.metric(t, "gpu_device_plugin_remediation_recoveries_total", nil),
			r.metric(t, "gpu_device_plugin_remediation_state", map[string]string{"gpu": r.uuid(i), "state": state}),
		}
		if slices.Equal(got, want) || time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	if !slices.Equal(got, want) {
		t.Errorf("metrics: resets success %v, failure %v, recoveries %v, state %s %v; want %v", got[0], got[1], got[2], state, got[3], want)
	}
}

// healthSeen is GPU i's health in every list the kubelet got, each change
// once: the kubelet's side of the story.
func (r *remNode) healthSeen(i int) []string {
	var out []string
	for _, l := range r.k.Lists(harness.ResourceName) {
		d := l.Devices[r.uuid(i)]
		h := "absent"
		if d != nil {
			h = d.Health
		}
		if len(out) == 0 || out[len(out)-1] != h {
			out = append(out, h)
		}
	}
	return out
}

// othersUntouched checks every list the kubelet got: each has every GPU,
// and every GPU but sick is healthy in each.
func (r *remNode) othersUntouched(t *testing.T) {
	t.Helper()
	lists := r.k.Lists(harness.ResourceName)
	for _, l := range lists {
		if len(l.Devices) != len(r.profile.GPUs) {
			t.Errorf("list %d has %d GPUs, want %d", l.Seq, len(l.Devices), len(r.profile.GPUs))
		}
		for i := range r.profile.GPUs {
			if d := l.Devices[r.uuid(i)]; i != sick && (d == nil || d.Health != api.Healthy) {
				t.Errorf("list %d: GPU %d is %v, want Healthy throughout: only GPU %d faulted", l.Seq, i, d, sick)
			}
		}
	}
	t.Logf("%d lists, GPUs other than %d Healthy in each", len(lists), sick)
}

// mockLog is the running plugin's mock NVML log.
func (r *remNode) mockLog(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(r.p.WorkDir, "mock.log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// logTime is when the plugin wrote e.
func logTime(t *testing.T, e harness.LogEntry) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, e.String("time"))
	if err != nil {
		t.Fatalf("log line %v: time: %v", e, err)
	}
	return at
}

// eventually polls cond until it holds or waitTimeout passes: for what
// has no signal to wait on (a counter of the fake PodResources API).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, waitTimeout)
		}
		<-tick.C
	}
}

// wantOneReset checks that the plugin reset GPU i once, and that the mock
// NVML saw each step of that reset (drain, removal, rediscovery) once.
func (r *remNode) wantOneReset(t *testing.T, i int) {
	t.Helper()
	if n := r.count("resetting"); n != 1 {
		t.Errorf("%d resets, want 1", n)
	}
	mock := r.mockLog(t)
	for _, step := range []string{
		fmt.Sprintf("nvmlDeviceModifyDrainState: gpu %d: drain state on", i),
		fmt.Sprintf("gpu %d: removed", i),
		fmt.Sprintf("nvmlDeviceDiscoverGpus: gpu %d: rediscovered", i),
	} {
		if n := strings.Count(mock, step); n != 1 {
			t.Errorf("the mock NVML's log has %q %d times, want once:\n%s", step, n, mock)
		}
	}
}

// ms is d in milliseconds, for the figures.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// TestRemediationResetsOneGPU: the driver asks for a reset of GPU 3 while
// a pod holds it and a process runs on it. GPU 3 is withheld at once and
// stays out while either is there; then the plugin resets it through NVML
// (drain, remove, rediscover), probes it with CUDA and offers it again.
// No other GPU's health changes at any point.
func TestRemediationResetsOneGPU(t *testing.T) {
	r := startRemediation(t)
	id := r.uuid(sick)
	r.hold(sick)
	r.inject(t, fmt.Sprintf("procs %d 4242:1024", sick))

	fault := time.Now()
	r.inject(t, fmt.Sprintf("recovery %d reset", sick))
	unhealthy := r.waitHealth(t, sick, api.Unhealthy).ReceivedAt
	w := r.waitTransition(t, sick, "serving", "draining")
	if g := r.mustSaved(t, sick); g.State != "draining" || !strings.Contains(g.Reason, "recovery-action=reset") {
		t.Errorf("remediation.json while a pod holds it: %+v, want draining for recovery-action=reset", g)
	}
	r.waitLog(t, sick, "withholding the GPU for its remediation")

	// The pod is still there: the plugin keeps looking and keeps it out.
	polls := r.pods.Lists()
	eventually(t, "three more PodResources polls", func() bool { return r.pods.Lists() >= polls+3 })
	if n := r.count("resetting"); n != 0 {
		t.Fatalf("reset %d times while a pod held the GPU", n)
	}

	r.hold()
	r.waitTransition(t, sick, "draining", "waitingIdle")
	polls = r.pods.Lists()
	eventually(t, "three more polls with the process still there", func() bool { return r.pods.Lists() >= polls+3 })
	if n := r.count("resetting"); n != 0 {
		t.Fatalf("reset %d times while a process ran on the GPU", n)
	}
	if d := r.mustSaved(t, sick); d.State != "waitingIdle" {
		t.Errorf("remediation.json with a process on it: %+v, want waitingIdle", d)
	}

	idle := time.Now()
	r.inject(t, fmt.Sprintf("procs %d", sick))
	reset := logTime(t, r.waitLog(t, sick, "resetting"))
	back := r.waitHealth(t, sick, api.Healthy).ReceivedAt
	givenBack := logTime(t, r.waitLog(t, sick, "giving the GPU back"))
	// The transition is logged after the give-back.
	r.waitTransition(t, sick, "probing", "serving")

	if got, want := r.transitions(sick), []string{"serving", "draining", "waitingIdle", "resetting", "probing", "serving"}; !slices.Equal(got, want) {
		t.Errorf("GPU %d went %v, want %v", sick, got, want)
	}
	if got, want := r.healthSeen(sick), []string{api.Healthy, api.Unhealthy, api.Healthy}; !slices.Equal(got, want) {
		t.Errorf("the kubelet saw GPU %d %v, want %v", sick, got, want)
	}
	r.othersUntouched(t)
	r.wantOneReset(t, sick)
	if g := r.mustSaved(t, sick); g.State != "serving" || len(g.Resets) != 1 {
		t.Errorf("remediation.json after: %+v, want serving with one reset in the budget", g)
	}
	r.wantMetrics(t, sick, 1, 0, 1, "serving")
	if n := r.metric(t, "gpu_device_plugin_remediation_recovery_seconds", nil); n != 1 {
		t.Errorf("recovery_seconds has %v samples, want 1", n)
	}
	if _, err := r.e.Allocate(ctx(t), id); err != nil {
		t.Errorf("Allocate of the GPU given back: %v", err)
	}

	t.Logf("figures on the mock (dgx-h100, GPU %d, usage poll 100ms, health poll %v):", sick, pollInterval)
	// Health itself lists the GPU unhealthy for the recovery action; the
	// withhold is what keeps it out until it is proven.
	drained := logTime(t, w)
	t.Logf("  fault -> withheld (the plugin's withhold line): %s; fault -> the kubelet lists it Unhealthy: %s", ms(drained.Sub(fault)), ms(unhealthy.Sub(fault)))
	t.Logf("  withheld -> reset started: %s, of which the test kept a pod, then a process, on it %s; last user gone -> reset started: %s", ms(reset.Sub(drained)), ms(idle.Sub(drained)), ms(reset.Sub(idle)))
	t.Logf("  reset started -> offered again (the kubelet lists it Healthy): %s (given back %s after the reset started; health's next poll reads the recovery action cleared)", ms(back.Sub(reset)), ms(givenBack.Sub(reset)))
}

// TestRemediationNeedsHuman: a remediation that cannot end well leaves
// the GPU out with the reason in remediation.json, and changes nothing
// else: a reset that fails, a GPU that comes back from its reset still
// asking for one (NVML does not read it clean), and one on which the CUDA
// probe fails.
func TestRemediationNeedsHuman(t *testing.T) {
	for _, c := range []struct {
		name string
		// mock is injected before the fault; cudaConf is the mock
		// libcuda's switches.
		mock, cudaConf string
		// from is the state it fails in; reason what remediation.json
		// says; mockSays what the mock NVML's log must say.
		from, reason, mockSays string
		success, failure       float64
	}{
		{
			name: "reset fails", mock: fmt.Sprintf("resetfail %d", sick),
			from: "resetting", reason: "the reset failed", mockSays: "failing as injected (resetfail)",
			failure: 1,
		},
		{
			name: "comes back broken", mock: fmt.Sprintf("comebackbroken %d", sick),
			from: "probing", reason: "the probe failed: NVML does not read it clean", mockSays: "rediscovered broken (comebackbroken)",
			success: 1,
		},
		{
			name: "CUDA probe fails", cudaConf: "fail cuCtxCreate 999",
			from: "probing", reason: "the CUDA probe failed", mockSays: "rediscovered",
			success: 1,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var conf []string
			if c.cudaConf != "" {
				conf = append(conf, c.cudaConf)
			}
			r := startRemediation(t, conf...)
			if c.mock != "" {
				r.inject(t, c.mock)
			}
			r.inject(t, fmt.Sprintf("recovery %d reset", sick))
			r.waitHealth(t, sick, api.Unhealthy)
			r.waitTransition(t, sick, c.from, "needsHuman")
			r.waitLog(t, sick, "the GPU stays out until a human acts")

			g := r.mustSaved(t, sick)
			if g.State != "needsHuman" || !strings.Contains(g.Reason, c.reason) || !strings.Contains(g.Reason, "recovery-action=reset") {
				t.Errorf("remediation.json: %+v; want needsHuman, saying %q and why it was out", g, c.reason)
			}
			if mock := r.mockLog(t); !strings.Contains(mock, c.mockSays) {
				t.Errorf("the mock NVML's log does not say %q:\n%s", c.mockSays, mock)
			}
			r.wantMetrics(t, sick, c.success, c.failure, 0, "needsHuman")
			if n := r.count("resetting"); n != 1 {
				t.Errorf("%d resets, want 1", n)
			}
			if l, _ := r.k.Devices(harness.ResourceName); l.Devices[r.uuid(sick)].GetHealth() != api.Unhealthy {
				t.Errorf("GPU %d is listed %v, want Unhealthy", sick, l.Devices[r.uuid(sick)])
			}
			if got, want := r.healthSeen(sick), []string{api.Healthy, api.Unhealthy}; !slices.Equal(got, want) {
				t.Errorf("the kubelet saw GPU %d %v, want %v", sick, got, want)
			}
			r.othersUntouched(t)
		})
	}
}

// TestRemediationXIDWhileWithheld: XIDs, a reset-class XID among them,
// and health clearing the GPU by itself (the driver's recovery action
// asked, then none) while a pod still holds it neither give it back early
// nor start a second remediation: once the pod is gone it is reset once
// and given back once.
func TestRemediationXIDWhileWithheld(t *testing.T) {
	r := startRemediation(t)
	id := r.uuid(sick)
	r.hold(sick)
	r.inject(t, fmt.Sprintf("xid %d 48", sick))
	r.waitTransition(t, sick, "serving", "draining")
	r.waitHealth(t, sick, api.Unhealthy)

	healthSays := func(what string, match func(harness.LogEntry) bool) {
		t.Helper()
		if _, err := r.p.WaitLog(ctx(t), what, func(e harness.LogEntry) bool { return e.String("device") == id && match(e) }); err != nil {
			t.Fatal(err)
		}
	}
	// Health's fatal XID 48 clears once the driver asked for a recovery,
	// then none: health calls the GPU healthy while it is withheld.
	r.inject(t, fmt.Sprintf("recovery %d reset", sick))
	healthSays("health seeing the recovery action", func(e harness.LogEntry) bool {
		return strings.Contains(e.String("reason"), "recovery-action=reset")
	})
	r.inject(t, fmt.Sprintf("recovery %d none", sick))
	healthSays("health calling GPU 3 healthy", func(e harness.LogEntry) bool {
		return e.String("msg") == "GPU health changed" && e.String("new") == api.Healthy
	})
	// More XIDs while withheld: 94 calls for a reset too, 13 for nothing.
	r.inject(t, fmt.Sprintf("xid %d 94", sick), fmt.Sprintf("xid %d 13", sick))
	healthSays("health seeing XID 94", func(e harness.LogEntry) bool { return strings.Contains(e.String("reason"), "xid=94") })

	polls := r.pods.Lists()
	eventually(t, "three more PodResources polls", func() bool { return r.pods.Lists() >= polls+3 })
	if n := r.count("resetting"); n != 0 {
		t.Fatalf("reset %d times while a pod held the GPU", n)
	}
	if n := r.count("giving the GPU back"); n != 0 {
		t.Fatalf("given back %d times while a pod held it", n)
	}
	if g := r.mustSaved(t, sick); g.State != "draining" {
		t.Errorf("remediation.json: %+v, want draining", g)
	}

	r.hold()
	r.waitLog(t, sick, "giving the GPU back")
	// The transition is logged after the give-back.
	r.waitTransition(t, sick, "probing", "serving")
	// XID 94's condition is dropped with the GPU given back: proven by
	// the reset and the probe.
	r.waitHealth(t, sick, api.Healthy)
	if got, want := r.transitions(sick), []string{"serving", "draining", "resetting", "probing", "serving"}; !slices.Equal(got, want) {
		t.Errorf("GPU %d went %v, want %v", sick, got, want)
	}
	if n := r.count("resetting"); n != 1 {
		t.Errorf("%d resets, want 1", n)
	}
	if n := strings.Count(r.mockLog(t), fmt.Sprintf("gpu %d: removed", sick)); n != 1 {
		t.Errorf("the mock NVML removed GPU %d %d times, want once", sick, n)
	}
	r.wantMetrics(t, sick, 1, 0, 1, "serving")
	// Every list the kubelet got, in order: one withhold, one give back;
	// an early one would show as a Healthy in between.
	if got, want := r.healthSeen(sick), []string{api.Healthy, api.Unhealthy, api.Healthy}; !slices.Equal(got, want) {
		t.Errorf("the kubelet saw GPU %d %v, want %v", sick, got, want)
	}
	r.othersUntouched(t)
}

// TestRemediationSurvivesSIGKILL: the plugin is SIGKILLed in the middle of
// GPU 3's remediation, while probing and while resetting; started again
// on the same state dir, it never resets blindly again.
func TestRemediationSurvivesSIGKILL(t *testing.T) {
	t.Run("while probing", killedWhileProbing)
	t.Run("while resetting", killedWhileResetting)
}

// killedWhileProbing: the plugin is SIGKILLed after it reset GPU 3 and
// before the probe proved it (the probe hangs in cuCtxCreate, so the kill
// lands there every time). Started again on the same state dir, it
// withholds the GPU from its first list, probes it, and gives it back,
// without a second reset; the reset counts once in the budget.
func killedWhileProbing(t *testing.T) {
	r := startRemediation(t, "hang cuCtxCreate")
	id := r.uuid(sick)
	r.inject(t, fmt.Sprintf("recovery %d reset", sick))
	r.waitTransition(t, sick, "resetting", "probing")
	r.waitLog(t, sick, "probing before the GPU is given back")
	if g := r.mustSaved(t, sick); g.State != "probing" || len(g.Resets) != 1 {
		t.Fatalf("remediation.json while probing: %+v, want probing with one reset", g)
	}

	restarted := time.Now()
	r.restart(t, func() {
		// The GPU works now: the next probe passes.
		if err := os.WriteFile(r.cudaConf, []byte(strings.Join(r.gpuLines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	// Its first list may offer the GPU already, if the probe passed
	// before the plugin registered; never before it passed.
	withheld := r.waitLog(t, sick, "withholding the GPU for its remediation")
	if !strings.HasPrefix(withheld.String("reason"), "restored: ") {
		t.Errorf("the restarted plugin withheld GPU %d for %q, want the restored remediation's reason", sick, withheld.String("reason"))
	}
	r.waitLog(t, sick, "probing before the GPU is given back")
	givenBack := logTime(t, r.waitLog(t, sick, "giving the GPU back"))
	r.waitHealth(t, sick, api.Healthy)
	for _, l := range r.k.Lists(harness.ResourceName) {
		if l.ReceivedAt.After(restarted) && l.ReceivedAt.Before(givenBack) && l.Devices[id].GetHealth() != api.Unhealthy {
			t.Errorf("list %d from the restarted plugin offers GPU %d before the probe proved it", l.Seq, sick)
		}
	}

	if n := r.count("resetting"); n != 0 {
		t.Errorf("the restarted plugin reset %d times, want none: it probes", n)
	}
	if mock := r.mockLog(t); strings.Contains(mock, "removed") {
		t.Errorf("the restarted plugin's mock NVML removed a GPU:\n%s", mock)
	}
	if g := r.mustSaved(t, sick); g.State != "serving" || len(g.Resets) != 1 {
		t.Errorf("remediation.json after: %+v, want serving with the one reset in the budget", g)
	}
	r.wantMetrics(t, sick, 0, 0, 1, "serving")
	if got, want := r.healthSeen(sick), []string{api.Healthy, api.Unhealthy, api.Healthy}; !slices.Equal(got, want) {
		t.Errorf("the kubelet saw GPU %d %v, want %v", sick, got, want)
	}
	r.othersUntouched(t)
}

// killedWhileResetting: the plugin is SIGKILLed inside its reset of GPU
// 3, the mock NVML holding the call (reset-pause), once in the removal and
// once in the rediscovery. A driver whose caller dies there keeps what was
// done: the GPU draining (not removed yet), or removed (not rediscovered
// yet); the mock keeps that across processes (MOCK_NVML_DRAIN_STATE) and
// shows it to the restarted plugin. The reset's outcome is unknown to the
// restarted plugin, so it never resets again, nor touches the drain
// state: it probes what is there (a GPU it cannot see, it cannot) and
// keeps the GPU out for a human, saying why, rather than give it back.
func killedWhileResetting(t *testing.T) {
	for _, c := range []struct {
		name string
		at   mocknvml.ResetStep
		// left is what the driver holds of the GPU after the kill.
		left string
		// from is the state the restarted plugin leaves for needsHuman;
		// reason what remediation.json then says.
		from   string
		reason []string
	}{
		{
			name: "in the removal: left draining", at: mocknvml.ResetPauseRemove, left: "draining",
			from: "probing", reason: []string{"the probe failed: NVML does not read it clean", "drain-state=on", "recovery-action=reset"},
		},
		{
			name: "in the rediscovery: left removed", at: mocknvml.ResetPauseDiscover, left: "removed",
			from: "resetting", reason: []string{"not on the node", "found resetting after a restart", "recovery-action=reset"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startRemediation(t)
			id := r.uuid(sick)
			paused := r.pauseReset(t, sick, c.at)
			r.inject(t, fmt.Sprintf("recovery %d reset", sick))
			paused()
			r.waitLog(t, sick, "resetting")
			if g := r.mustSaved(t, sick); g.State != "resetting" || len(g.Resets) != 1 {
				t.Fatalf("remediation.json with the reset stopped in its %s: %+v, want resetting with one reset", c.at, g)
			}

			var left []string
			restarted := time.Now()
			r.restart(t, func() { left = r.drainStateSays(t) })
			if want := []string{c.left + " " + id}; !slices.Equal(left, want) {
				t.Fatalf("after the kill the driver holds %q, want %q", left, want)
			}
			r.waitTransition(t, sick, c.from, "needsHuman")
			human := r.waitLog(t, sick, "the GPU stays out until a human acts")
			t.Logf("the restarted plugin keeps GPU %d out: %s", sick, human.String("reason"))
			for _, w := range c.reason {
				if !strings.Contains(human.String("reason"), w) {
					t.Errorf("the restarted plugin keeps GPU %d out for %q, want it to say %q", sick, human.String("reason"), w)
				}
			}
			g := r.mustSaved(t, sick)
			if g.State != "needsHuman" || g.Reason != human.String("reason") || len(g.Resets) != 1 {
				t.Errorf("remediation.json: %+v; want needsHuman for %q, the one reset in the budget", g, human.String("reason"))
			}

			// Never reset again, nor the driver's state touched: the GPU is
			// as the killed plugin left it.
			if n := r.count("resetting"); n != 0 {
				t.Errorf("the restarted plugin reset %d times, want none", n)
			}
			mock := r.mockLog(t)
			if !strings.Contains(mock, fmt.Sprintf("nvmlInit: gpu %d: %s, as an earlier process left it", sick, c.left)) {
				t.Errorf("the restarted plugin's mock NVML did not start with GPU %d %s:\n%s", sick, c.left, mock)
			}
			for _, call := range []string{"nvmlDeviceModifyDrainState", "nvmlDeviceRemoveGpu", "nvmlDeviceDiscoverGpus"} {
				if strings.Contains(mock, call) {
					t.Errorf("the restarted plugin called %s:\n%s", call, mock)
				}
			}
			if got := r.drainStateSays(t); !slices.Equal(got, left) {
				t.Errorf("the driver holds %q after the restart, want %q as the kill left it", got, left)
			}

			// Not offered by the restarted plugin at any point: listed
			// Unhealthy while NVML shows it, absent while it does not.
			// Every other GPU is listed Healthy throughout.
			lists := 0
			for _, l := range r.k.Lists(harness.ResourceName) {
				if !l.ReceivedAt.After(restarted) {
					continue
				}
				lists++
				d := l.Devices[id]
				switch {
				case c.left == "removed" && d != nil:
					t.Errorf("list %d from the restarted plugin lists GPU %d, which NVML does not show: %v", l.Seq, sick, d)
				case c.left != "removed" && d.GetHealth() != api.Unhealthy:
					t.Errorf("list %d from the restarted plugin lists GPU %d %v, want Unhealthy", l.Seq, sick, d)
				}
				for i := range r.profile.GPUs {
					if d := l.Devices[r.uuid(i)]; i != sick && d.GetHealth() != api.Healthy {
						t.Errorf("list %d: GPU %d is %v, want Healthy", l.Seq, i, d)
					}
				}
			}
			if lists == 0 {
				t.Error("no list from the restarted plugin")
			}
			r.wantMetrics(t, sick, 0, 0, 0, "needsHuman")
		})
	}
}

// TestRemediationFaultWhileResetting: faults arrive while the plugin's
// reset of GPU 3 is stopped in the removal (the GPU draining, still in
// NVML's view and getting events). What remedy's Machine defines for a
// fault while resetting holds on the real binary: no second reset and
// nothing given back early; a fault calling for a reset (XID 94, a new
// recovery action) is left to the probe, which finds the GPU clean after
// the reset, so it is given back; one calling for a human (XID 64) keeps
// it out for a human once the reset ends, without a probe. Stopped in
// the rediscovery instead, the GPU removed, health reads it lost through
// its old handle: the reset's own doing, which the probe judges, not a
// GPU off the bus calling for a node reboot.
func TestRemediationFaultWhileResetting(t *testing.T) {
	for _, c := range []struct {
		name string
		// at is where the reset stops; faults are injected meanwhile;
		// healthSays is what health's reason says of the GPU meanwhile.
		at         mocknvml.ResetStep
		faults     []string
		healthSays string
		// note is how the plugin's note of a fault while resetting
		// starts; facts what the notes name.
		note  string
		facts []string
		// transitions are GPU 3's states; reason what keeps it out at the
		// end ("" given back).
		transitions []string
		reason      string
		success     float64
		recoveries  float64
		end         string
	}{
		{
			name:        "XID 94 and a recovery action: the probe judges",
			at:          mocknvml.ResetPauseRemove,
			faults:      []string{fmt.Sprintf("xid %d 94", sick), fmt.Sprintf("recovery %d drain-and-reset", sick)},
			note:        "remediation: a fault while resetting; the probe judges it: ",
			facts:       []string{"xid=94", "recovery-action=drain-and-reset"},
			transitions: []string{"serving", "draining", "resetting", "probing", "serving"},
			success:     1, recoveries: 1, end: "serving",
		},
		{
			name:        "XID 64: out for a human once the reset ends",
			at:          mocknvml.ResetPauseRemove,
			faults:      []string{fmt.Sprintf("xid %d 64", sick)},
			note:        "remediation: a fault while resetting; out for a human or a reboot once that ends: ",
			facts:       []string{"xid=64"},
			transitions: []string{"serving", "draining", "resetting", "needsHuman"},
			reason:      "xid=64",
			success:     1, end: "needsHuman",
		},
		{
			// Health polls the GPU through its old handle while it is
			// removed: NVML answers GPU_IS_LOST, which is the reset's own
			// doing, not the GPU falling off the bus.
			name:        "stopped in the rediscovery, the GPU removed: the probe judges",
			at:          mocknvml.ResetPauseDiscover,
			healthSays:  "gpu-lost",
			note:        "remediation: a fault while resetting; the probe judges it: ",
			facts:       []string{"recovery-action=reset"},
			transitions: []string{"serving", "draining", "resetting", "probing", "serving"},
			success:     1, recoveries: 1, end: "serving",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startRemediation(t)
			id := r.uuid(sick)
			paused := r.pauseReset(t, sick, c.at)
			r.inject(t, fmt.Sprintf("recovery %d reset", sick))
			paused()
			r.waitLog(t, sick, "resetting")

			r.inject(t, c.faults...)
			for _, f := range c.facts {
				if _, err := r.p.WaitLog(ctx(t), fmt.Sprintf("%q naming %s", c.note, f), func(e harness.LogEntry) bool {
					return e.String("gpu") == id && strings.HasPrefix(e.String("msg"), c.note) && strings.Contains(e.String("msg"), f)
				}); err != nil {
					t.Fatal(err)
				}
			}
			if c.healthSays != "" {
				if _, err := r.p.WaitLog(ctx(t), "health saying "+c.healthSays, func(e harness.LogEntry) bool {
					return e.String("device") == id && strings.Contains(e.String("reason"), c.healthSays)
				}); err != nil {
					t.Fatal(err)
				}
			}
			// Health polls a few times more while the reset is stopped.
			time.Sleep(3 * pollInterval)
			if n := r.count("giving the GPU back"); n != 0 {
				t.Fatalf("given back %d times while its reset was stopped", n)
			}
			if g := r.mustSaved(t, sick); g.State != "resetting" || len(g.Resets) != 1 {
				t.Errorf("remediation.json while the reset is stopped: %+v, want resetting with one reset", g)
			}

			if err := r.p.Control().ResumeReset(sick); err != nil {
				t.Fatal(err)
			}
			if c.end == "serving" {
				r.waitLog(t, sick, "giving the GPU back")
				r.waitTransition(t, sick, "probing", "serving")
				r.waitHealth(t, sick, api.Healthy)
			} else {
				human := r.waitLog(t, sick, "the GPU stays out until a human acts")
				if !strings.Contains(human.String("reason"), c.reason) {
					t.Errorf("GPU %d kept out for %q, want it to say %q", sick, human.String("reason"), c.reason)
				}
			}

			if got := r.transitions(sick); !slices.Equal(got, c.transitions) {
				t.Errorf("GPU %d went %v, want %v", sick, got, c.transitions)
			}
			r.wantOneReset(t, sick)
			g := r.mustSaved(t, sick)
			if g.State != c.end || len(g.Resets) != 1 || !strings.Contains(g.Reason, c.reason) {
				t.Errorf("remediation.json after: %+v, want %s with one reset, saying %q", g, c.end, c.reason)
			}
			if c.end == "needsHuman" && r.count("probing before the GPU is given back") != 0 {
				t.Error("probed a GPU the Machine sends to a human")
			}
			r.wantMetrics(t, sick, c.success, 0, c.recoveries, c.end)
			want := []string{api.Healthy, api.Unhealthy, api.Healthy}
			if c.end != "serving" {
				want = want[:2]
			}
			if got := r.healthSeen(sick); !slices.Equal(got, want) {
				t.Errorf("the kubelet saw GPU %d %v, want %v", sick, got, want)
			}
			r.othersUntouched(t)
		})
	}
}
