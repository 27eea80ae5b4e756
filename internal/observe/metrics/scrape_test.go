package metrics

import (
	"errors"
	"flag"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	prt "github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources/podresourcestest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics/exposition"
)

var update = flag.Bool("update", false, "rewrite testdata/scrape.txt from what the code writes")

// oddReason needs every escape a label value has.
const oddReason = "say \"hi\"\\ then\nbye"

type probes struct{ ready, live error }

func (p probes) Ready() error { return p.ready }
func (p probes) Live() error  { return p.live }

// fixture registers with reg what NewMetrics, RegisterProbes and
// Allocations write, each family with series.
func fixture(t *testing.T, reg *exposition.Registry) {
	t.Helper()
	const driver, pool = "gpu-device-plugin.github.io", "node-1"
	kubelet := prt.Start(t,
		prt.Pod("ml", "train", prt.Container("main", prt.Devices("nvidia.com/gpu", "GPU-0"), prt.Devices("example.com/rdma", "0000:18:00.0"))),
		prt.Pod("ml", "serve", prt.ClaimContainer("a", prt.Claim("ml", "c", driver, pool, "gpu-1"))),
	)
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := RegisterProbes(reg, probes{ready: errors.New("not yet")}); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(m.Allocations(AllocationOptions{Holders: podresources.Client{Socket: kubelet.Socket}.Holders, Driver: driver, Pool: pool})); err != nil {
		t.Fatal(err)
	}
	gpu, nic := m.For("nvidia.com/gpu"), m.For("example.com/rdma")
	m.SetInfo("nvidia.com/gpu", "GPU-0", DeviceInfo{UUID: "GPU-0", Index: "0", Model: "NVIDIA H100 80GB HBM3", PCIBusID: "0000:07:00.0", NUMANode: 0, DRAName: "gpu-0"})
	m.SetInfo("nvidia.com/gpu", "GPU-1", DeviceInfo{UUID: "GPU-1", Index: "1", Model: "NVIDIA H100 80GB HBM3", PCIBusID: "0000:08:00.0", NUMANode: -1, DRAName: "gpu-1"})
	m.SetInfo("nvidia.com/gpu.shared", "GPU-2", DeviceInfo{UUID: "GPU-2", Index: "2", Sharing: SharingTimeSlicing, Replicas: 4, NUMANode: 1})
	m.SetInfo("nvidia.com/gpu.mps", "GPU-3", DeviceInfo{UUID: "GPU-3", Index: "3", Sharing: SharingMPS, Replicas: 2, NUMANode: 1})
	m.SetInfo("example.com/rdma", "0000:18:00.0", DeviceInfo{Model: "15b3:1021", PCIBusID: "0000:18:00.0", NUMANode: 1, DRAName: "nic-0000-18-00-0"})
	gpu.Health("GPU-0", true, "")
	gpu.Health("GPU-1", false, oddReason)
	gpu.Transition("GPU-1", false, oddReason)
	gpu.Transition("GPU-1", true, "")
	nic.Health("0000:18:00.0", false, "link down")
	nic.Transition("0000:18:00.0", false, "link down")
	m.SetMPSDaemons(func() map[string]bool { return map[string]bool{"GPU-3": true, "GPU-4": false} })
	m.SetRuntimeDoor(true, "containerd", "envvarAccepted")
	m.ObserveRequest("patch", "nodes/status", "200")
	m.ObserveRequest("create", "events", "429")
	m.ObserveRequest("create", "events", "429")
	r := m.Remediation()
	r.State("GPU-0", "serving")
	r.State("GPU-1", "draining")
	r.Reset("success")
	r.Reset("failure")
	r.Recovered(90 * time.Second)
	r.Recovered(2 * time.Hour)
}

// Every family of ours, as users' alerts and dashboards read it: names,
// HELP, TYPE, labels and their order, values. testdata/scrape.txt was
// first written by client_golang's handler from the same calls, so a
// difference is one users see.
func TestScrapeGolden(t *testing.T) {
	reg := exposition.NewRegistry()
	fixture(t, reg)
	got := scrape(t, reg)
	golden := filepath.Join("testdata", "scrape.txt")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("scrape differs from %s (-update rewrites it):\n%s", golden, got)
	}
}

// The whole of /metrics as the daemon registers it, read by Prometheus's
// own parser: every family with its type, a reason with a quote, a
// backslash and a newline read back whole, and the same bytes at each
// scrape while nothing changes.
func TestScrapeParses(t *testing.T) {
	reg := exposition.NewRegistry()
	for _, c := range []exposition.Collector{GoRuntime(), Process(fakeProc(t))} {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := RegisterCDIHook(reg); err != nil {
		t.Fatal(err)
	}
	fixture(t, reg)
	srv := httptest.NewServer(reg)
	defer srv.Close()

	get := func() string {
		t.Helper()
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
			t.Errorf("Content-Type %q", ct)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	first := get()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(first))
	if err != nil {
		t.Fatalf("Prometheus's parser refuses /metrics: %v\n%s", err, first)
	}

	want := servedFamilies()
	got := map[string]dto.MetricType{}
	for name, f := range fams {
		got[name] = f.GetType()
		if f.GetHelp() == "" {
			t.Errorf("%s has no HELP", name)
		}
		// What promlint asked of the old registry.
		if (f.GetType() == dto.MetricType_COUNTER) != strings.HasSuffix(name, "_total") {
			t.Errorf("%s is a %v: counters, and only they, end in _total", name, f.GetType())
		}
	}
	if !maps.Equal(got, want) {
		for _, n := range slices.Sorted(maps.Keys(want)) {
			if got[n] != want[n] {
				t.Errorf("%s: %v, want %v", n, got[n], want[n])
			}
		}
		for _, n := range slices.Sorted(maps.Keys(got)) {
			if _, ok := want[n]; !ok {
				t.Errorf("%s (%v) is not one of the families documented", n, got[n])
			}
		}
	}

	var reasons []string
	for _, m := range fams["gpu_device_plugin_device_healthy"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" {
				reasons = append(reasons, l.GetValue())
			}
		}
	}
	if !slices.Contains(reasons, oddReason) {
		t.Errorf("reasons read back as %q, want one to be %q", reasons, oddReason)
	}

	// The Go runtime's own figures move with every allocation, the
	// scrape's included: the rest must not.
	if a, b := withoutGo(first), withoutGo(get()); a != b {
		t.Errorf("two scrapes of an unchanged state differ:\n%s\n----\n%s", a, b)
	}
}

// servedFamilies are the families /metrics serves, by type: the daemon's
// registry holds the Go runtime's and the process's, the CDI hook's, and
// what NewMetrics, RegisterProbes and Allocations register.
func servedFamilies() map[string]dto.MetricType {
	return map[string]dto.MetricType{
		"gpu_device_plugin_api_requests_total":           dto.MetricType_COUNTER,
		"gpu_device_plugin_cdi_hook_installed":           dto.MetricType_GAUGE,
		"gpu_device_plugin_device_allocated":             dto.MetricType_GAUGE,
		"gpu_device_plugin_device_healthy":               dto.MetricType_GAUGE,
		"gpu_device_plugin_device_info":                  dto.MetricType_GAUGE,
		"gpu_device_plugin_device_sharing":               dto.MetricType_GAUGE,
		"gpu_device_plugin_health_transitions_total":     dto.MetricType_COUNTER,
		"gpu_device_plugin_live":                         dto.MetricType_GAUGE,
		"gpu_device_plugin_mps_daemon_up":                dto.MetricType_GAUGE,
		"gpu_device_plugin_ready":                        dto.MetricType_GAUGE,
		"gpu_device_plugin_remediation_recoveries_total": dto.MetricType_COUNTER,
		"gpu_device_plugin_remediation_recovery_seconds": dto.MetricType_HISTOGRAM,
		"gpu_device_plugin_remediation_resets_total":     dto.MetricType_COUNTER,
		"gpu_device_plugin_remediation_state":            dto.MetricType_GAUGE,
		"gpu_device_plugin_runtime_envvar_door_open":     dto.MetricType_GAUGE,
		"go_gc_duration_seconds":                         dto.MetricType_SUMMARY,
		"go_gc_gogc_percent":                             dto.MetricType_GAUGE,
		"go_gc_gomemlimit_bytes":                         dto.MetricType_GAUGE,
		"go_goroutines":                                  dto.MetricType_GAUGE,
		"go_info":                                        dto.MetricType_GAUGE,
		"go_memstats_heap_alloc_bytes":                   dto.MetricType_GAUGE,
		"go_memstats_sys_bytes":                          dto.MetricType_GAUGE,
		"go_threads":                                     dto.MetricType_GAUGE,
		"process_cpu_seconds_total":                      dto.MetricType_COUNTER,
		"process_max_fds":                                dto.MetricType_GAUGE,
		"process_open_fds":                               dto.MetricType_GAUGE,
		"process_resident_memory_bytes":                  dto.MetricType_GAUGE,
		"process_start_time_seconds":                     dto.MetricType_GAUGE,
		"process_virtual_memory_bytes":                   dto.MetricType_GAUGE,
	}
}

func withoutGo(exposition string) string {
	var b strings.Builder
	for line := range strings.Lines(exposition) {
		if !strings.HasPrefix(line, "go_") && !strings.HasPrefix(line, "# HELP go_") && !strings.HasPrefix(line, "# TYPE go_") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// fakeProc is a /proc whose self is a process of pid 4242, started 50s
// after a boot at 1700000000, with 3.8s of CPU, 2000 pages resident,
// three files open out of 1048576.
func fakeProc(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		// The command name holds a space and parentheses.
		"self/stat":   "4242 (gpu (device) plugin) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 130 0 0 20 0 12 0 5000 1600000000 2000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n",
		"self/limits": "Limit                     Soft Limit           Hard Limit           Units     \nMax cpu time              unlimited            unlimited            seconds   \nMax open files            1048576              1048576              files     \n",
		"stat":        "cpu  1 2 3 4 5 6 7 0 0 0\nintr 12345 0 0\nctxt 999\nbtime 1700000000\nprocesses 100\n",
		"self/fd/0":   "",
		"self/fd/1":   "",
		"self/fd/2":   "",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestProcess(t *testing.T) {
	rss := strconv.FormatFloat(2000*float64(os.Getpagesize()), 'g', -1, 64)
	all := `# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 3.8
# HELP process_max_fds Maximum number of open file descriptors.
# TYPE process_max_fds gauge
process_max_fds 1.048576e+06
# HELP process_open_fds Number of open file descriptors.
# TYPE process_open_fds gauge
process_open_fds 3
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes ` + rss + `
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.70000005e+09
# HELP process_virtual_memory_bytes Virtual memory size in bytes.
# TYPE process_virtual_memory_bytes gauge
process_virtual_memory_bytes 1.6e+09
`
	// without is all without the families named.
	without := func(names ...string) string {
		var b strings.Builder
		for line := range strings.Lines(all) {
			f := strings.Fields(strings.TrimPrefix(strings.TrimPrefix(line, "# HELP "), "# TYPE "))[0]
			if !slices.Contains(names, f) {
				b.WriteString(line)
			}
		}
		return b.String()
	}
	tests := []struct {
		name   string
		change func(root string) error
		want   string
	}{
		{"every file there", func(string) error { return nil }, all},
		{"no limits: no max_fds", func(root string) error { return os.Remove(filepath.Join(root, "self/limits")) }, without("process_max_fds")},
		{"unlimited open files", func(root string) error {
			return os.WriteFile(filepath.Join(root, "self/limits"), []byte("Max open files            unlimited            unlimited            files     \n"), 0o644)
		}, strings.Replace(all, "process_max_fds 1.048576e+06", "process_max_fds 1.8446744073709552e+19", 1)},
		{"no btime: no start time", func(root string) error {
			return os.WriteFile(filepath.Join(root, "stat"), []byte("cpu  1 2 3\n"), 0o644)
		}, without("process_start_time_seconds")},
		{"stat cut short: nothing of it", func(root string) error {
			return os.WriteFile(filepath.Join(root, "self/stat"), []byte("4242 (plugin) S 1 4242\n"), 0o644)
		}, without("process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes", "process_start_time_seconds")},
		{"no /proc at all", func(root string) error { return os.RemoveAll(root) }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := fakeProc(t)
			if err := tt.change(root); err != nil {
				t.Fatal(err)
			}
			if got := collect(t, Process(root)); got != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

// This process, from the real /proc.
func TestProcessSelf(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("no /proc")
	}
	fams := parse(t, collect(t, Process("/proc")))
	if len(fams) != 6 {
		t.Errorf("%d families, want all 6: %v", len(fams), slices.Sorted(maps.Keys(fams)))
	}
	now := float64(time.Now().Unix())
	for name, ok := range map[string]func(float64) bool{
		"process_resident_memory_bytes": func(v float64) bool { return v > 1<<20 },
		"process_virtual_memory_bytes":  func(v float64) bool { return v > 1<<20 },
		"process_open_fds":              func(v float64) bool { return v >= 3 },
		"process_max_fds":               func(v float64) bool { return v >= 3 },
		"process_start_time_seconds":    func(v float64) bool { return v > now-24*3600 && v <= now+1 },
		"process_cpu_seconds_total":     func(v float64) bool { return v >= 0 },
	} {
		if v := value(fams[name]); !ok(v) {
			t.Errorf("%s = %v", name, v)
		}
	}
}

func TestGoRuntime(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(73))
	runtime.GC()
	fams := parse(t, collect(t, GoRuntime()))
	if len(fams) != 8 {
		t.Errorf("%d families, want 8: %v", len(fams), slices.Sorted(maps.Keys(fams)))
	}
	if v := value(fams["go_gc_gogc_percent"]); v != 73 {
		t.Errorf("go_gc_gogc_percent %v, want 73 as set", v)
	}
	if v, want := value(fams["go_gc_gomemlimit_bytes"]), float64(debug.SetMemoryLimit(-1)); v != want {
		t.Errorf("go_gc_gomemlimit_bytes %v, want %v", v, want)
	}
	for _, name := range []string{"go_goroutines", "go_threads", "go_memstats_heap_alloc_bytes"} {
		if v := value(fams[name]); v < 1 {
			t.Errorf("%s = %v", name, v)
		}
	}
	if heap, sys := value(fams["go_memstats_heap_alloc_bytes"]), value(fams["go_memstats_sys_bytes"]); sys < heap {
		t.Errorf("go_memstats_sys_bytes %v is below the heap's %v", sys, heap)
	}
	if l := fams["go_info"].GetMetric()[0].GetLabel(); len(l) != 1 || l[0].GetName() != "version" || l[0].GetValue() != runtime.Version() {
		t.Errorf("go_info labels %v, want version=%s", l, runtime.Version())
	}
	s := fams["go_gc_duration_seconds"].GetMetric()[0].GetSummary()
	var qs []float64
	for _, q := range s.GetQuantile() {
		qs = append(qs, q.GetQuantile())
	}
	if s.GetSampleCount() < 1 || !slices.Equal(qs, []float64{0, 0.25, 0.5, 0.75, 1}) {
		t.Errorf("go_gc_duration_seconds: %d pauses, quantiles %v; want at least the GC run here, and min, quartiles, max", s.GetSampleCount(), qs)
	}
}

func parse(t *testing.T, exposition string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(exposition))
	if err != nil {
		t.Fatalf("%v\n%s", err, exposition)
	}
	return fams
}

// value is a one-series gauge's or counter's value; NaN when there is no
// series.
func value(f *dto.MetricFamily) float64 {
	if f == nil || len(f.GetMetric()) != 1 {
		return math.NaN()
	}
	m := f.GetMetric()[0]
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// docs/health.md's metric tables list every family served, and no other.
func TestDocumentedMetrics(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "health.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Metrics\n")
	if !ok {
		t.Fatal("docs/health.md has no Metrics section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	documented := map[string]bool{}
	for line := range strings.Lines(section) {
		// A table row naming a metric: | `name` | ...
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			name, _, _ := strings.Cut(rest, "`")
			documented[name] = true
		}
	}
	served := servedFamilies()
	for _, n := range slices.Sorted(maps.Keys(served)) {
		if !documented[n] {
			t.Errorf("%s is served but not in docs/health.md's Metrics tables", n)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(documented)) {
		if _, ok := served[n]; !ok {
			t.Errorf("docs/health.md documents %s, which is not served", n)
		}
	}
}
