package exposition

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
)

// Counter is a counter family whose values are kept here, by label
// values. Without labels its one series is there from the start, at 0; a
// labelled series appears when first counted.
type Counter struct {
	desc *Desc

	mu     sync.Mutex
	counts map[string]*counted // by joinLabels of the values
}

type counted struct {
	labels []string
	n      float64
}

// NewCounter returns a counter family described by d (its Type is set).
func NewCounter(d Desc) *Counter {
	d.Type = TypeCounter
	c := &Counter{desc: &d, counts: map[string]*counted{}}
	if len(d.Labels) == 0 {
		c.counts[""] = &counted{}
	}
	return c
}

// Inc adds 1 to the series of labelValues, one per label.
func (c *Counter) Inc(labelValues ...string) {
	if len(labelValues) != len(c.desc.Labels) {
		panic(fmt.Sprintf("exposition: %s: %d label values for labels %v", c.desc.Name, len(labelValues), c.desc.Labels))
	}
	k := joinLabels(labelValues)
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.counts[k]
	if e == nil {
		e = &counted{labels: slices.Clone(labelValues)}
		c.counts[k] = e
	}
	e.n++
}

// Describe implements Collector.
func (c *Counter) Describe() []*Desc { return []*Desc{c.desc} }

// Collect implements Collector.
func (c *Counter) Collect(s *Scrape) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.counts {
		s.Add(c.desc, e.n, e.labels...)
	}
}

// joinLabels keys a series by its label values; 0xff is in no UTF-8
// text, so two lists never join alike.
func joinLabels(values []string) string { return strings.Join(values, "\xff") }

// Gauge is one gauge series without labels, there from the start at 0.
type Gauge struct {
	desc *Desc

	mu sync.Mutex
	v  float64
}

// NewGauge returns the gauge described by d, which has no labels (its
// Type is set).
func NewGauge(d Desc) *Gauge {
	d.Type = TypeGauge
	noLabels(d)
	return &Gauge{desc: &d}
}

// Set sets the gauge to v.
func (g *Gauge) Set(v float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.v = v
}

// Describe implements Collector.
func (g *Gauge) Describe() []*Desc { return []*Desc{g.desc} }

// Collect implements Collector.
func (g *Gauge) Collect(s *Scrape) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s.Add(g.desc, g.v)
}

// Histogram is one histogram series without labels, there from the start
// with every bucket at 0.
type Histogram struct {
	desc   *Desc
	bounds []float64

	mu     sync.Mutex
	counts []uint64 // per bound, not cumulative
	count  uint64
	sum    float64
}

// NewHistogram returns the histogram described by d, which has no labels,
// with buckets of the upper bounds given, in increasing order (its Type is
// set).
func NewHistogram(d Desc, upperBounds []float64) *Histogram {
	d.Type = TypeHistogram
	noLabels(d)
	if !slices.IsSorted(upperBounds) || slices.Contains(upperBounds, math.Inf(1)) {
		panic(fmt.Sprintf("exposition: %s: bounds %v are not increasing, or hold +Inf (always there)", d.Name, upperBounds))
	}
	return &Histogram{desc: &d, bounds: slices.Clone(upperBounds), counts: make([]uint64, len(upperBounds))}
}

// Observe counts v.
func (h *Histogram) Observe(v float64) {
	i, _ := slices.BinarySearch(h.bounds, v) // the first bound >= v
	h.mu.Lock()
	defer h.mu.Unlock()
	if i < len(h.counts) {
		h.counts[i]++
	}
	h.count++
	h.sum += v
}

// Describe implements Collector.
func (h *Histogram) Describe() []*Desc { return []*Desc{h.desc} }

// Collect implements Collector.
func (h *Histogram) Collect(s *Scrape) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := Distribution{Count: h.count, Sum: h.sum, Buckets: make([]Bucket, len(h.bounds))}
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i]
		d.Buckets[i] = Bucket{UpperBound: b, Count: cum}
	}
	s.AddDistribution(h.desc, d)
}

func noLabels(d Desc) {
	if len(d.Labels) > 0 {
		panic(fmt.Sprintf("exposition: %s: labels %v on a series kept without labels", d.Name, d.Labels))
	}
}
