// Package exposition writes metrics in the Prometheus text format 0.0.4,
// collected at each scrape: a Registry of Collectors, each of which adds
// its series to a Scrape, and the Registry's handler that writes them,
// sorted, so that an unchanged state reads the same byte for byte. It is
// what /metrics needs of Prometheus's client library and no more: no
// protobuf, no OpenMetrics, no exemplars.
package exposition

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// ContentType is the text format's, as Prometheus expects it.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Type is a family's TYPE.
type Type string

// The types a family can have.
const (
	TypeCounter   Type = "counter"
	TypeGauge     Type = "gauge"
	TypeHistogram Type = "histogram"
	TypeSummary   Type = "summary"
)

// Desc describes one family: its name, HELP text, TYPE and label names.
// Series give their label values in the order of Labels.
type Desc struct {
	Name   string
	Help   string
	Type   Type
	Labels []string
}

// Collector adds its families' series to each scrape.
type Collector interface {
	// Describe lists the families Collect adds to: Register checks them,
	// and a scrape takes no other.
	Describe() []*Desc
	// Collect adds the series as they are now. A source that cannot be
	// read gives no series: it must not fail the scrape.
	Collect(*Scrape)
}

var (
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelName  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// ErrDuplicate is Register's error for a family registered before.
var ErrDuplicate = errors.New("registered twice")

// Registry holds the collectors /metrics writes out.
type Registry struct {
	mu         sync.Mutex
	collectors []Collector
	descs      map[string]*Desc
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{descs: map[string]*Desc{}}
}

// Register adds c, once its families are checked: valid names, a HELP
// text, a known type, and no family another collector has.
func (r *Registry) Register(c Collector) error {
	descs := c.Describe()
	seen := map[string]bool{}
	for _, d := range descs {
		if err := d.check(); err != nil {
			return err
		}
		if seen[d.Name] {
			return fmt.Errorf("metric %s: %w", d.Name, ErrDuplicate)
		}
		seen[d.Name] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range descs {
		if r.descs[d.Name] != nil {
			return fmt.Errorf("metric %s: %w", d.Name, ErrDuplicate)
		}
	}
	for _, d := range descs {
		r.descs[d.Name] = d
	}
	r.collectors = append(r.collectors, c)
	return nil
}

// check says what is wrong with d, if anything.
func (d *Desc) check() error {
	if !metricName.MatchString(d.Name) {
		return fmt.Errorf("metric name %q: not [a-zA-Z_:][a-zA-Z0-9_:]*", d.Name)
	}
	if d.Help == "" {
		return fmt.Errorf("metric %s: no help text", d.Name)
	}
	var reserved string
	switch d.Type {
	case TypeCounter, TypeGauge:
	case TypeHistogram:
		reserved = "le"
	case TypeSummary:
		reserved = "quantile"
	default:
		return fmt.Errorf("metric %s: type %q is none of counter, gauge, histogram, summary", d.Name, d.Type)
	}
	for i, l := range d.Labels {
		switch {
		case !labelName.MatchString(l) || strings.HasPrefix(l, "__"):
			return fmt.Errorf("metric %s: label name %q: not [a-zA-Z_][a-zA-Z0-9_]*, or starts with __", d.Name, l)
		case l == reserved:
			return fmt.Errorf("metric %s: label %s is the %s's own", d.Name, l, d.Type)
		case slices.Contains(d.Labels[:i], l):
			return fmt.Errorf("metric %s: label %s twice", d.Name, l)
		}
	}
	return nil
}

// Scrape gathers the series of one scrape. Collectors add to it; only the
// Registry makes one.
type Scrape struct {
	families map[string]*family
}

type family struct {
	desc   *Desc
	series []series
}

// series is one sample (counter, gauge), or one histogram's or summary's
// lines.
type series struct {
	labels []string // values, in the order of desc.Labels
	value  float64
	dist   Distribution
}

// Bucket is one of a histogram's buckets: how many observations were at
// most UpperBound.
type Bucket struct {
	UpperBound float64
	Count      uint64 // cumulative
}

// Quantile is one of a summary's quantiles.
type Quantile struct {
	Quantile, Value float64
}

// Distribution is the value of a histogram series (Buckets, without +Inf,
// which is Count) or of a summary series (Quantiles).
type Distribution struct {
	Count     uint64
	Sum       float64
	Buckets   []Bucket
	Quantiles []Quantile
}

// Add adds a counter's or a gauge's sample. d must be one of the
// collector's families, and labelValues one per label: anything else is
// a bug in the collector, and panics.
func (s *Scrape) Add(d *Desc, v float64, labelValues ...string) {
	f := s.family(d, labelValues)
	if d.Type != TypeCounter && d.Type != TypeGauge {
		panic(fmt.Sprintf("exposition: %s is a %s: add a Distribution", d.Name, d.Type))
	}
	f.series = append(f.series, series{labels: labels(labelValues), value: v})
}

// AddDistribution adds a histogram's or a summary's series; it panics as
// Add does.
func (s *Scrape) AddDistribution(d *Desc, v Distribution, labelValues ...string) {
	f := s.family(d, labelValues)
	if d.Type != TypeHistogram && d.Type != TypeSummary {
		panic(fmt.Sprintf("exposition: %s is a %s: Add a value", d.Name, d.Type))
	}
	f.series = append(f.series, series{labels: labels(labelValues), dist: v})
}

func (s *Scrape) family(d *Desc, labelValues []string) *family {
	f := s.families[d.Name]
	if f == nil || f.desc != d {
		panic(fmt.Sprintf("exposition: %s is not a registered family", d.Name))
	}
	if len(labelValues) != len(d.Labels) {
		panic(fmt.Sprintf("exposition: %s: %d label values for labels %v", d.Name, len(labelValues), d.Labels))
	}
	return f
}

// labels is a copy of values that is valid UTF-8: Prometheus would refuse
// the scrape otherwise, and a device's reason carries whatever a driver
// said.
func labels(values []string) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = strings.ToValidUTF8(v, "\uFFFD")
	}
	return out
}

// WriteTo collects every collector and writes what they added in the text
// format: families by name, and in each the series by their label values
// in the order of their label names, as they are written.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	return r.render().WriteTo(w)
}

// ServeHTTP answers with the text format, whatever the method and path,
// as client_golang's handler did.
func (r *Registry) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	b := r.render()
	w.Header().Set("Content-Type", ContentType)
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	// An error here is the scraper gone: there is no one to tell.
	b.WriteTo(w)
}

// render collects and writes one scrape.
func (r *Registry) render() *bytes.Buffer {
	r.mu.Lock()
	s := &Scrape{families: make(map[string]*family, len(r.descs))}
	for name, d := range r.descs {
		s.families[name] = &family{desc: d}
	}
	collectors := slices.Clone(r.collectors)
	r.mu.Unlock()
	// Collected outside the lock: a collector may ask the kubelet, and a
	// slow answer must not hold up a Register.
	for _, c := range collectors {
		c.Collect(s)
	}
	var b bytes.Buffer
	for _, name := range slices.Sorted(maps.Keys(s.families)) {
		s.families[name].write(&b)
	}
	return &b
}

// write writes f's HELP, TYPE and series, unless it has none.
func (f *family) write(b *bytes.Buffer) {
	if len(f.series) == 0 {
		return
	}
	d := f.desc
	// Labels are written, and series sorted, by label name.
	order := make([]int, len(d.Labels))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(i, j int) int { return strings.Compare(d.Labels[i], d.Labels[j]) })
	slices.SortStableFunc(f.series, func(a, b series) int {
		for _, i := range order {
			if c := strings.Compare(a.labels[i], b.labels[i]); c != 0 {
				return c
			}
		}
		return 0
	})
	b.WriteString("# HELP ")
	b.WriteString(d.Name)
	b.WriteByte(' ')
	helpEscaper.WriteString(b, d.Help)
	b.WriteString("\n# TYPE ")
	b.WriteString(d.Name)
	b.WriteByte(' ')
	b.WriteString(string(d.Type))
	b.WriteByte('\n')
	for i, s := range f.series {
		// The format allows one sample per series: Prometheus would
		// refuse the whole scrape over a repeat, so the first one stays.
		if i > 0 && slices.Equal(s.labels, f.series[i-1].labels) {
			continue
		}
		writeSeries := func(suffix, extraName, extraValue string) {
			b.WriteString(d.Name)
			b.WriteString(suffix)
			writeLabels(b, d.Labels, order, s.labels, extraName, extraValue)
		}
		switch d.Type {
		case TypeCounter, TypeGauge:
			writeSeries("", "", "")
			writeValue(b, s.value)
		case TypeHistogram:
			for _, bk := range s.dist.Buckets {
				writeSeries("_bucket", "le", formatFloat(bk.UpperBound))
				writeCount(b, bk.Count)
			}
			writeSeries("_bucket", "le", "+Inf")
			writeCount(b, s.dist.Count)
		case TypeSummary:
			for _, q := range s.dist.Quantiles {
				writeSeries("", "quantile", formatFloat(q.Quantile))
				writeValue(b, q.Value)
			}
		}
		if d.Type == TypeHistogram || d.Type == TypeSummary {
			writeSeries("_sum", "", "")
			writeValue(b, s.dist.Sum)
			writeSeries("_count", "", "")
			writeCount(b, s.dist.Count)
		}
	}
}

var (
	// HELP escapes backslash and newline; label values the double quote
	// too.
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

// writeLabels writes {name="value",...} in order, then extraName's, if
// any; nothing when there are no labels at all.
func writeLabels(b *bytes.Buffer, names []string, order []int, values []string, extraName, extraValue string) {
	if len(names) == 0 && extraName == "" {
		return
	}
	b.WriteByte('{')
	sep := false
	pair := func(name, value string) {
		if sep {
			b.WriteByte(',')
		}
		sep = true
		b.WriteString(name)
		b.WriteString(`="`)
		labelEscaper.WriteString(b, value)
		b.WriteByte('"')
	}
	for _, i := range order {
		pair(names[i], values[i])
	}
	if extraName != "" {
		pair(extraName, extraValue)
	}
	b.WriteByte('}')
}

func writeValue(b *bytes.Buffer, v float64) {
	b.WriteByte(' ')
	b.WriteString(formatFloat(v))
	b.WriteByte('\n')
}

func writeCount(b *bytes.Buffer, n uint64) {
	b.WriteByte(' ')
	b.WriteString(strconv.FormatUint(n, 10))
	b.WriteByte('\n')
}

// formatFloat writes v as Prometheus reads it: the shortest form that
// reads back the same (1e+06, 0.25), and NaN, +Inf, -Inf.
func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
