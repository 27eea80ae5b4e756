package allocbench

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/allocator"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/gpu"
)

var report = flag.Bool("allocbench.report", false, "also time both policies on every all-available size and log the speed ratios (slow)")

var profiles = []string{
	"../profiles/dgx-h100.profile",
	"../profiles/pcie-4gpu.profile",
	"../profiles/hgx-16.profile",
	"testdata/dgx1-v100.profile",
}

// machine is one profile as each policy sees it.
type machine struct {
	name  string
	uuids []string // discovery order, both sides
	graph *allocator.Graph
	devs  map[string]*gpuallocator.Device
}

func load(t testing.TB, path string) *machine {
	t.Helper()
	prof, err := mocknvml.LoadProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	lib := NewLibrary(prof)
	sysfs := t.TempDir()
	if err := prof.WriteSysfs(sysfs); err != nil {
		t.Fatal(err)
	}
	inv, err := nvml.Discover(lib, sysfs, nil)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := gpuallocator.NewDevices(gpuallocator.WithNvmlLib(lib))
	if err != nil {
		t.Fatal(err)
	}
	m := &machine{name: prof.Name, graph: gpu.NewGraph(inv.GPUs, inv.Topology), devs: map[string]*gpuallocator.Device{}}
	for _, g := range inv.GPUs {
		m.uuids = append(m.uuids, g.UUID)
	}
	for _, d := range devs {
		m.devs[d.UUID] = d
	}
	if len(devs) != len(inv.GPUs) || len(inv.GPUs) != len(prof.GPUs) {
		t.Fatalf("%s: go-gpuallocator found %d GPUs, discovery %d, the profile has %d", m.name, len(devs), len(inv.GPUs), len(prof.GPUs))
	}
	return m
}

func (m *machine) ids(idx []int) []string {
	out := make([]string, len(idx))
	for k, i := range idx {
		out[k] = m.uuids[i]
	}
	return out
}

// theirs asks go-gpuallocator's best-effort policy.
func (m *machine) theirs(available, must []string, size int) []string {
	var avail, req []*gpuallocator.Device
	for _, id := range available {
		avail = append(avail, m.devs[id])
	}
	for _, id := range must {
		req = append(req, m.devs[id])
	}
	var out []string
	for _, d := range gpuallocator.NewBestEffortPolicy().Allocate(avail, req, size) {
		out = append(out, d.UUID)
	}
	return out
}

// partitions estimates the GPU partitions go-gpuallocator's best-effort
// policy walks for size of n: every way to split n (padded up to a
// multiple of size) into sets of size. It takes a few microseconds each,
// so past a few tens of thousands one answer takes seconds: 16 GPUs take
// 3 to over 20 s for every size but 1, 8 to 12 and 16.
func partitions(n, size int) float64 {
	if size <= 1 || size >= n {
		return 1
	}
	padded := (n + size - 1) / size * size
	p := 1.0
	for i := 2; i <= padded; i++ {
		p *= float64(i)
	}
	for range padded / size {
		for i := 2; i <= size; i++ {
			p /= float64(i)
		}
	}
	for i := 2; i <= padded/size; i++ {
		p /= float64(i)
	}
	return p
}

// tractable: go-gpuallocator answers within about 0.1 s (more under -race).
func tractable(n, size int) bool { return partitions(n, size) <= 20_000 }

type request struct {
	available, must []string
	size            int
}

// requests: every size with all GPUs free, then random fragmented ones
// (seeded, so a failure repeats), all within go-gpuallocator's reach.
func (m *machine) requests() []request {
	n := len(m.uuids)
	var out []request
	for size := 1; size <= n; size++ {
		if tractable(n, size) {
			out = append(out, request{available: m.uuids, size: size})
		}
	}
	rng := rand.New(rand.NewPCG(42, uint64(n)))
	for len(out) < 60 {
		perm := rng.Perm(n)
		avail := perm[:1+rng.IntN(n)]
		size := 1 + rng.IntN(len(avail))
		if !tractable(len(avail), size) {
			continue
		}
		must := avail[:rng.IntN(min(size, 2)+1)]
		slices.Sort(avail)
		out = append(out, request{available: m.ids(avail), must: m.ids(must), size: size})
	}
	return out
}

// TestCompareScores scores both policies' answers with this plugin's Score
// on the same requests. Ours is exact up to 16 GPUs, so it may tie but
// never lose; the test fails if it does, or if either answer breaks the
// request's constraints.
func TestCompareScores(t *testing.T) {
	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "machine\trequests\tours better\ttie\ttheirs better\tours better on link\tlink ours/theirs\tfewer NUMA nodes\t")
	for _, path := range profiles {
		m := load(t, path)
		var better, tie, worse, betterLink, fewerNodes int
		var linkOurs, linkTheirs int64
		for _, r := range m.requests() {
			ours, err := m.graph.Choose(r.available, r.must, r.size)
			if err != nil {
				t.Fatalf("%s: %v", m.name, err)
			}
			theirIDs := m.theirs(r.available, r.must, r.size)
			theirs, err := m.graph.Score(r.available, theirIDs)
			if err != nil || len(theirIDs) != r.size {
				t.Fatalf("%s: go-gpuallocator answered %v for %d of %v: %v", m.name, theirIDs, r.size, r.available, err)
			}
			for _, id := range r.must {
				if !slices.Contains(theirIDs, id) {
					t.Fatalf("%s: go-gpuallocator's %v lacks must-include %s", m.name, theirIDs, id)
				}
			}
			switch c := ours.Score.Compare(theirs); {
			case c > 0:
				better++
			case c == 0:
				tie++
			default:
				worse++
				t.Errorf("%s: request %+v: ours %v %+v scores below go-gpuallocator's %v %+v", m.name, r, ours.IDs, ours.Score, theirIDs, theirs)
			}
			if ours.Score.Link > theirs.Link {
				betterLink++
			}
			if ours.Score.NUMANodes < theirs.NUMANodes {
				fewerNodes++
			}
			linkOurs += ours.Score.Link
			linkTheirs += theirs.Link
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.4f\t%d\t\n", m.name, better+tie+worse, better, tie, worse, betterLink,
			float64(linkOurs)/float64(max(linkTheirs, 1)), fewerNodes)
	}
	tw.Flush()
	t.Logf("this plugin's Score of both answers:\n%s", table.String())
}

// TestCompareSequence fills each machine with one stream of requests, each
// policy taking from what it left itself, and sums the link score of what
// every request got: a policy that leaves good sets behind does better on
// the later requests.
func TestCompareSequence(t *testing.T) {
	streams := map[int][]int{4: {1, 2, 1}, 8: {1, 2, 1, 2, 2}, 16: {8, 1, 2, 1, 4}}
	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "machine\tstream\tlink sum ours\tlink sum theirs\tNUMA-split sets ours\ttheirs\t")
	for _, path := range profiles {
		m := load(t, path)
		stream := streams[len(m.uuids)]
		var sums [2]int64
		var split [2]int
		for k, policy := range []func(avail []string, size int) []string{
			func(avail []string, size int) []string {
				c, err := m.graph.Choose(avail, nil, size)
				if err != nil {
					t.Fatal(err)
				}
				return c.IDs
			},
			func(avail []string, size int) []string {
				if !tractable(len(avail), size) {
					t.Fatalf("%s: %d of %d is out of go-gpuallocator's reach", m.name, size, len(avail))
				}
				return m.theirs(avail, nil, size)
			},
		} {
			free := slices.Clone(m.uuids)
			for _, size := range stream {
				got := policy(free, size)
				s, err := m.graph.Score(free, got)
				if err != nil || len(got) != size {
					t.Fatalf("%s: policy %d answered %v for %d: %v", m.name, k, got, size, err)
				}
				sums[k] += s.Link
				if s.NUMANodes > 1 {
					split[k]++
				}
				free = slices.DeleteFunc(free, func(id string) bool { return slices.Contains(got, id) })
			}
		}
		fmt.Fprintf(tw, "%s\t%v\t%d\t%d\t%d\t%d\t\n", m.name, stream, sums[0], sums[1], split[0], split[1])
	}
	tw.Flush()
	t.Logf("a stream of requests on an empty machine:\n%s", table.String())
}

// TestSpeedRatio times both policies on every all-available size each can
// answer in time; only with -allocbench.report.
func TestSpeedRatio(t *testing.T) {
	if !*report {
		t.Skip("timings only with -allocbench.report")
	}
	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "machine\tsize\tours ns/op\tallocs\tgo-gpuallocator ns/op\tallocs\tratio\t")
	for _, path := range profiles {
		m := load(t, path)
		for size := 1; size <= len(m.uuids); size++ {
			ours := testing.Benchmark(func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := m.graph.Choose(m.uuids, nil, size); err != nil {
						b.Fatal(err)
					}
				}
			})
			if !tractable(len(m.uuids), size) {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\tskipped: ~%.1g partitions\t\t\t\n", m.name, size, ours.NsPerOp(), ours.AllocsPerOp(), partitions(len(m.uuids), size))
				continue
			}
			theirs := testing.Benchmark(func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					m.theirs(m.uuids, nil, size)
				}
			})
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.1fx\t\n", m.name, size, ours.NsPerOp(), ours.AllocsPerOp(),
				theirs.NsPerOp(), theirs.AllocsPerOp(), float64(theirs.NsPerOp())/float64(max(ours.NsPerOp(), 1)))
		}
	}
	tw.Flush()
	t.Logf("all GPUs available; ratio = go-gpuallocator time / ours:\n%s", table.String())
}

// BenchmarkPolicies: one answer with every GPU available, each policy,
// every size go-gpuallocator answers in time.
func BenchmarkPolicies(b *testing.B) {
	for _, path := range profiles {
		m := load(b, path)
		for size := 1; size <= len(m.uuids); size++ {
			if !tractable(len(m.uuids), size) {
				continue
			}
			b.Run(fmt.Sprintf("%s/size=%d/ours", m.name, size), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := m.graph.Choose(m.uuids, nil, size); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("%s/size=%d/go-gpuallocator", m.name, size), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					m.theirs(m.uuids, nil, size)
				}
			})
		}
	}
}

// TestSameMachine: both discoveries agree on the GPUs, and this plugin's
// sees every NVLink of the profile (NVSwitch fabrics as all-to-all).
func TestSameMachine(t *testing.T) {
	for _, path := range profiles {
		m := load(t, path)
		for _, id := range m.uuids {
			if m.devs[id] == nil {
				t.Errorf("%s: go-gpuallocator lacks %s", m.name, id)
			}
		}
	}
	m := load(t, "testdata/dgx1-v100.profile")
	// GPU 0 has two NVLinks to GPU 3 and one to GPU 1: both sides see it.
	s03, err := m.graph.Score(m.uuids, m.ids([]int{0, 3}))
	if err != nil {
		t.Fatal(err)
	}
	s01, err := m.graph.Score(m.uuids, m.ids([]int{0, 1}))
	if err != nil {
		t.Fatal(err)
	}
	if s03.Link != 2000+11 || s01.Link != 1000+41 {
		t.Errorf("link scores 0-3 %d, 0-1 %d; want 2011 and 1041", s03.Link, s01.Link)
	}
	if n := len(m.devs[m.uuids[0]].Links[3]); n != 2 {
		t.Errorf("go-gpuallocator sees %d links between GPUs 0 and 3 (PCIe and NVLink), want 2", n)
	}
}
