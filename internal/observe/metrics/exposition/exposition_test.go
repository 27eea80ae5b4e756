package exposition

import (
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// collectorFunc is a Collector of descs whose series add adds.
type collectorFunc struct {
	descs []*Desc
	add   func(*Scrape)
}

func (c collectorFunc) Describe() []*Desc { return c.descs }
func (c collectorFunc) Collect(s *Scrape) { c.add(s) }

func text(t *testing.T, cs ...Collector) string {
	t.Helper()
	reg := NewRegistry()
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	var b strings.Builder
	if _, err := reg.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestWrite(t *testing.T) {
	gauge := &Desc{Name: "a_gauge", Help: "A gauge.", Type: TypeGauge, Labels: []string{"zone", "device"}}
	plain := &Desc{Name: "b_plain", Help: "Back\\slash and\nnewline in help; \"quotes\" stay.", Type: TypeGauge}
	counter := &Desc{Name: "c_total", Help: "A counter.", Type: TypeCounter, Labels: []string{"reason"}}
	empty := &Desc{Name: "d_empty", Help: "No series: not written.", Type: TypeGauge}
	hist := &Desc{Name: "e_seconds", Help: "A histogram.", Type: TypeHistogram, Labels: []string{"op"}}
	sum := &Desc{Name: "f_seconds", Help: "A summary.", Type: TypeSummary}
	tests := []struct {
		name  string
		descs []*Desc
		add   func(*Scrape)
		want  string
	}{
		{
			name:  "families by name, series by label values in label-name order, labels by name",
			descs: []*Desc{plain, gauge},
			add: func(s *Scrape) {
				s.Add(gauge, 1, "z", "GPU-1")
				s.Add(gauge, 2, "a", "GPU-1")
				s.Add(gauge, 3, "b", "GPU-0")
				s.Add(plain, 7)
			},
			want: `# HELP a_gauge A gauge.
# TYPE a_gauge gauge
a_gauge{device="GPU-0",zone="b"} 3
a_gauge{device="GPU-1",zone="a"} 2
a_gauge{device="GPU-1",zone="z"} 1
# HELP b_plain Back\\slash and\nnewline in help; "quotes" stay.
# TYPE b_plain gauge
b_plain 7
`,
		},
		{
			name:  "label values escaped, invalid UTF-8 replaced",
			descs: []*Desc{counter},
			add: func(s *Scrape) {
				s.Add(counter, 1, "say \"hi\"\\ then\nbye")
				s.Add(counter, 2, "bad \xff byte")
				s.Add(counter, 3, "")
			},
			want: `# HELP c_total A counter.
# TYPE c_total counter
c_total{reason=""} 3
c_total{reason="bad ` + "\uFFFD" + ` byte"} 2
c_total{reason="say \"hi\"\\ then\nbye"} 1
`,
		},
		{
			name:  "a family without series is left out",
			descs: []*Desc{empty, plain},
			add:   func(s *Scrape) { s.Add(plain, 0) },
			want:  "# HELP b_plain Back\\\\slash and\\nnewline in help; \"quotes\" stay.\n# TYPE b_plain gauge\nb_plain 0\n",
		},
		{
			name:  "a repeated series is written once, the first one added",
			descs: []*Desc{counter},
			add: func(s *Scrape) {
				s.Add(counter, 1, "x")
				s.Add(counter, 2, "x")
			},
			want: "# HELP c_total A counter.\n# TYPE c_total counter\nc_total{reason=\"x\"} 1\n",
		},
		{
			name:  "values as Prometheus reads them",
			descs: []*Desc{gauge},
			add: func(s *Scrape) {
				for i, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 1e6, 0.25, -1, 1234567, 1.8446744073709552e19} {
					s.Add(gauge, v, "z", string(rune('a'+i)))
				}
			},
			want: `# HELP a_gauge A gauge.
# TYPE a_gauge gauge
a_gauge{device="a",zone="z"} NaN
a_gauge{device="b",zone="z"} +Inf
a_gauge{device="c",zone="z"} -Inf
a_gauge{device="d",zone="z"} 1e+06
a_gauge{device="e",zone="z"} 0.25
a_gauge{device="f",zone="z"} -1
a_gauge{device="g",zone="z"} 1.234567e+06
a_gauge{device="h",zone="z"} 1.8446744073709552e+19
`,
		},
		{
			name:  "histogram: le after the labels, +Inf, sum, count",
			descs: []*Desc{hist},
			add: func(s *Scrape) {
				s.AddDistribution(hist, Distribution{Count: 3, Sum: 4.5, Buckets: []Bucket{{0.5, 1}, {2, 2}}}, "read")
			},
			want: `# HELP e_seconds A histogram.
# TYPE e_seconds histogram
e_seconds_bucket{op="read",le="0.5"} 1
e_seconds_bucket{op="read",le="2"} 2
e_seconds_bucket{op="read",le="+Inf"} 3
e_seconds_sum{op="read"} 4.5
e_seconds_count{op="read"} 3
`,
		},
		{
			name:  "summary: quantiles, sum, count",
			descs: []*Desc{sum},
			add: func(s *Scrape) {
				s.AddDistribution(sum, Distribution{Count: 2, Sum: 0.003, Quantiles: []Quantile{{0, 0.001}, {0.5, 0.001}, {1, 0.002}}})
			},
			want: `# HELP f_seconds A summary.
# TYPE f_seconds summary
f_seconds{quantile="0"} 0.001
f_seconds{quantile="0.5"} 0.001
f_seconds{quantile="1"} 0.002
f_seconds_sum 0.003
f_seconds_count 2
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := text(t, collectorFunc{tt.descs, tt.add})
			if got != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tt.want)
			}
			// What Prometheus's own parser makes of it.
			p := expfmt.NewTextParser(model.UTF8Validation)
			if _, err := p.TextToMetricFamilies(strings.NewReader(got)); err != nil {
				t.Errorf("Prometheus's parser refuses it: %v\n%s", err, got)
			}
		})
	}
}

// What the parser reads back is what was added: names, types, label
// values with every character that needs escaping.
func TestRoundTrip(t *testing.T) {
	reason := "say \"hi\"\\ then\nbye"
	g := &Desc{Name: "x_healthy", Help: "Help with \\ and\nnewline.", Type: TypeGauge, Labels: []string{"reason", "device"}}
	h := &Desc{Name: "x_seconds", Help: "H.", Type: TypeHistogram}
	got := text(t, collectorFunc{[]*Desc{g, h}, func(s *Scrape) {
		s.Add(g, 0, reason, "GPU-1")
		s.AddDistribution(h, Distribution{Count: 2, Sum: 3, Buckets: []Bucket{{1, 1}}})
	}})
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(got))
	if err != nil {
		t.Fatalf("%v\n%s", err, got)
	}
	f := fams["x_healthy"]
	if f == nil || f.GetType().String() != "GAUGE" || f.GetHelp() != g.Help || len(f.GetMetric()) != 1 {
		t.Fatalf("x_healthy read back as %v", f)
	}
	labels := map[string]string{}
	for _, l := range f.GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["reason"] != reason || labels["device"] != "GPU-1" {
		t.Errorf("labels read back as %q", labels)
	}
	hf := fams["x_seconds"]
	if hf.GetType().String() != "HISTOGRAM" || hf.GetMetric()[0].GetHistogram().GetSampleCount() != 2 || len(hf.GetMetric()[0].GetHistogram().GetBucket()) != 2 {
		t.Errorf("x_seconds read back as %v", hf)
	}
}

func TestRegister(t *testing.T) {
	ok := func(name string) *Desc { return &Desc{Name: name, Help: "h", Type: TypeGauge} }
	tests := []struct {
		name  string
		descs []*Desc
		want  string
	}{
		{"bad metric name", []*Desc{{Name: "0abc", Help: "h", Type: TypeGauge}}, `metric name "0abc"`},
		{"no help", []*Desc{{Name: "abc", Type: TypeGauge}}, "no help text"},
		{"no type", []*Desc{{Name: "abc", Help: "h"}}, `type ""`},
		{"bad label name", []*Desc{{Name: "abc", Help: "h", Type: TypeGauge, Labels: []string{"a-b"}}}, `label name "a-b"`},
		{"reserved label name", []*Desc{{Name: "abc", Help: "h", Type: TypeGauge, Labels: []string{"__name__"}}}, `label name "__name__"`},
		{"le on a histogram", []*Desc{{Name: "abc", Help: "h", Type: TypeHistogram, Labels: []string{"le"}}}, "label le is the histogram's own"},
		{"quantile on a summary", []*Desc{{Name: "abc", Help: "h", Type: TypeSummary, Labels: []string{"quantile"}}}, "label quantile is the summary's own"},
		{"a label twice", []*Desc{{Name: "abc", Help: "h", Type: TypeGauge, Labels: []string{"a", "b", "a"}}}, "label a twice"},
		{"a family twice in one collector", []*Desc{ok("abc"), ok("abc")}, "registered twice"},
		{"a family another collector has", []*Desc{ok("taken")}, "registered twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := NewRegistry()
			if err := reg.Register(collectorFunc{[]*Desc{ok("taken")}, func(*Scrape) {}}); err != nil {
				t.Fatal(err)
			}
			err := reg.Register(collectorFunc{tt.descs, func(*Scrape) {}})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Register: %v, want an error saying %q", err, tt.want)
			}
			if strings.Contains(tt.want, "registered twice") && !errors.Is(err, ErrDuplicate) {
				t.Errorf("%v is not ErrDuplicate", err)
			}
			// A refused collector is not collected.
			var b strings.Builder
			reg.WriteTo(&b)
			if strings.Contains(b.String(), "abc") {
				t.Errorf("a refused family is written:\n%s", b.String())
			}
		})
	}
}

// A collector that adds what it did not describe, or the wrong number of
// label values, is a bug: it panics rather than write a broken scrape.
func TestMisuse(t *testing.T) {
	g := &Desc{Name: "g", Help: "h", Type: TypeGauge, Labels: []string{"a"}}
	h := &Desc{Name: "h", Help: "h", Type: TypeHistogram}
	other := &Desc{Name: "g", Help: "h", Type: TypeGauge, Labels: []string{"a"}}
	tests := []struct {
		name string
		add  func(*Scrape)
	}{
		{"too few label values", func(s *Scrape) { s.Add(g, 1) }},
		{"too many label values", func(s *Scrape) { s.Add(g, 1, "x", "y") }},
		{"a family not described", func(s *Scrape) { s.Add(other, 1, "x") }},
		{"a value for a histogram", func(s *Scrape) { s.Add(h, 1) }},
		{"a distribution for a gauge", func(s *Scrape) { s.AddDistribution(g, Distribution{}, "x") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			reg := NewRegistry()
			if err := reg.Register(collectorFunc{[]*Desc{g, h}, tt.add}); err != nil {
				t.Fatal(err)
			}
			reg.WriteTo(io.Discard)
		})
	}
}

func TestServeHTTP(t *testing.T) {
	reg := NewRegistry()
	c := NewCounter(Desc{Name: "requests_total", Help: "Requests.", Labels: []string{"code"}})
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	c.Inc("200")
	srv := httptest.NewServer(reg)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	if want := "# HELP requests_total Requests.\n# TYPE requests_total counter\nrequests_total{code=\"200\"} 1\n"; string(body) != want || resp.StatusCode != http.StatusOK {
		t.Errorf("%d %q, want 200 %q", resp.StatusCode, body, want)
	}
	// What Prometheus negotiates from the header.
	if f := expfmt.ResponseFormat(resp.Header); f.FormatType() != expfmt.TypeTextPlain {
		t.Errorf("Prometheus reads the Content-Type as %v", f)
	}
}

func TestInstruments(t *testing.T) {
	plain := NewCounter(Desc{Name: "plain_total", Help: "P."})
	byCode := NewCounter(Desc{Name: "by_code_total", Help: "B.", Labels: []string{"code"}})
	g := NewGauge(Desc{Name: "g", Help: "G."})
	h := NewHistogram(Desc{Name: "h_seconds", Help: "H."}, []float64{1, 10})
	if got, want := text(t, plain, byCode, g, h), `# HELP g G.
# TYPE g gauge
g 0
# HELP h_seconds H.
# TYPE h_seconds histogram
h_seconds_bucket{le="1"} 0
h_seconds_bucket{le="10"} 0
h_seconds_bucket{le="+Inf"} 0
h_seconds_sum 0
h_seconds_count 0
# HELP plain_total P.
# TYPE plain_total counter
plain_total 0
`; got != want {
		t.Errorf("before any change:\n%s\nwant:\n%s", got, want)
	}
	plain.Inc()
	codes := []string{"500"}
	byCode.Inc(codes...)
	codes[0] = "changed after" // the counter keeps its own copy
	byCode.Inc("200")
	byCode.Inc("200")
	g.Set(0.5)
	for _, v := range []float64{0.5, 1, 1.5, 10, 11} { // a bound counts in its own bucket
		h.Observe(v)
	}
	if got, want := text(t, plain, byCode, g, h), `# HELP by_code_total B.
# TYPE by_code_total counter
by_code_total{code="200"} 2
by_code_total{code="500"} 1
# HELP g G.
# TYPE g gauge
g 0.5
# HELP h_seconds H.
# TYPE h_seconds histogram
h_seconds_bucket{le="1"} 2
h_seconds_bucket{le="10"} 4
h_seconds_bucket{le="+Inf"} 5
h_seconds_sum 24
h_seconds_count 5
# HELP plain_total P.
# TYPE plain_total counter
plain_total 1
`; got != want {
		t.Errorf("after:\n%s\nwant:\n%s", got, want)
	}

	for name, f := range map[string]func(){
		"unsorted bounds":    func() { NewHistogram(Desc{Name: "x", Help: "x"}, []float64{2, 1}) },
		"+Inf bound":         func() { NewHistogram(Desc{Name: "x", Help: "x"}, []float64{1, math.Inf(1)}) },
		"labelled gauge":     func() { NewGauge(Desc{Name: "x", Help: "x", Labels: []string{"a"}}) },
		"wrong label values": func() { byCode.Inc() },
	} {
		t.Run(name+" panics", func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f()
		})
	}
}

// Scrapes overlap with counting and with each other (go test -race).
func TestConcurrentScrapes(t *testing.T) {
	reg := NewRegistry()
	c := NewCounter(Desc{Name: "n_total", Help: "N.", Labels: []string{"k"}})
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 100 {
				c.Inc(string(rune('a' + (i+j)%3)))
				reg.WriteTo(io.Discard)
			}
		})
	}
	wg.Wait()
	if got := text(t, c); !strings.Contains(got, `n_total{k="a"} 134`) || !strings.Contains(got, `n_total{k="b"} 133`) || !strings.Contains(got, `n_total{k="c"} 133`) {
		t.Errorf("counts lost:\n%s", got)
	}
}
