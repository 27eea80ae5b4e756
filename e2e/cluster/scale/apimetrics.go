package scale

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
)

// serverMetrics is one scrape of the API server's /metrics, reduced to
// what the report uses.
type serverMetrics struct {
	// requests: apiserver_request_total by verb and resource.
	requests map[verbResource]float64
	// latency: apiserver_request_duration_seconds buckets by verb and
	// resource (upper bound → cumulative count).
	latency map[verbResource]map[float64]float64
	// watchEvents: apiserver_watch_events_total by resource (kind).
	watchEvents map[string]float64
}

func scrape(ctx context.Context, c kubernetes.Interface) (serverMetrics, error) {
	raw, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return serverMetrics{}, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return serverMetrics{}, fmt.Errorf("parsing the API server's /metrics: %w", err)
	}
	m := serverMetrics{
		requests:    map[verbResource]float64{},
		latency:     map[verbResource]map[float64]float64{},
		watchEvents: map[string]float64{},
	}
	if f := fams["apiserver_request_total"]; f != nil {
		for _, s := range f.Metric {
			m.requests[keyOf(s)] += s.GetCounter().GetValue()
		}
	}
	if f := fams["apiserver_request_duration_seconds"]; f != nil {
		for _, s := range f.Metric {
			k := keyOf(s)
			if m.latency[k] == nil {
				m.latency[k] = map[float64]float64{}
			}
			for _, b := range s.GetHistogram().GetBucket() {
				m.latency[k][b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
	}
	if f := fams["apiserver_watch_events_total"]; f != nil {
		for _, s := range f.Metric {
			m.watchEvents[label(s, "resource")] += s.GetCounter().GetValue()
		}
	}
	return m, nil
}

func label(s *dto.Metric, name string) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func keyOf(s *dto.Metric) verbResource {
	r := label(s, "resource")
	if sub := label(s, "subresource"); sub != "" {
		r += "/" + sub
	}
	return verbResource{verb: lowerVerb(label(s, "verb")), resource: r}
}

// lowerVerb maps the metric's verbs (GET, LIST, WATCH, POST, PATCH, PUT,
// DELETE) to the audit log's.
func lowerVerb(v string) string {
	switch v {
	case "GET":
		return "get"
	case "LIST":
		return "list"
	case "WATCH":
		return "watch"
	case "POST":
		return "create"
	case "PATCH":
		return "patch"
	case "PUT":
		return "update"
	case "DELETE":
		return "delete"
	}
	return v
}

// delta is what happened between two scrapes.
func (b serverMetrics) delta(a serverMetrics) serverMetrics {
	d := serverMetrics{
		requests:    map[verbResource]float64{},
		latency:     map[verbResource]map[float64]float64{},
		watchEvents: map[string]float64{},
	}
	for k, v := range b.requests {
		if x := v - a.requests[k]; x > 0 {
			d.requests[k] = x
		}
	}
	for k, bs := range b.latency {
		for ub, v := range bs {
			if x := v - a.latency[k][ub]; x > 0 {
				if d.latency[k] == nil {
					d.latency[k] = map[float64]float64{}
				}
				d.latency[k][ub] = x
			}
		}
	}
	for k, v := range b.watchEvents {
		if x := v - a.watchEvents[k]; x > 0 {
			d.watchEvents[k] = x
		}
	}
	return d
}

// quantile is the upper bound of the bucket holding quantile q of the
// requests whose verb and resource pass keep (a histogram's resolution:
// "≤ 0.05 s").
func (d serverMetrics) quantile(q float64, keep func(verbResource) bool) (float64, float64) {
	merged := map[float64]float64{}
	for k, bs := range d.latency {
		if keep(k) {
			for ub, v := range bs {
				merged[ub] += v
			}
		}
	}
	ubs := make([]float64, 0, len(merged))
	for ub := range merged {
		ubs = append(ubs, ub)
	}
	sort.Float64s(ubs)
	total := 0.0
	if len(ubs) > 0 {
		total = merged[ubs[len(ubs)-1]] // the +Inf bucket: every request
	}
	if total == 0 {
		return 0, 0
	}
	for _, ub := range ubs {
		if merged[ub] >= q*total {
			return ub, total
		}
	}
	return math.Inf(1), total
}
