package deploy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// checkRemediationAlerts evaluates the remediation's alerts, as rendered
// with values.yaml's for, window (1h) and threshold, with Prometheus' own
// engine on series as the plugin exports them, scraped a minute apart:
// each fires for its state or result and job only, and
// GPUDevicePluginResetFailing fires at the first failed reset too (its
// series is born then, which increase() alone does not see) and stops an
// hour after the last.
func checkRemediationAlerts(t *testing.T, alerts map[string]monitoringv1.Rule, job string) {
	t.Helper()
	always := func(int) float64 { return 1 }
	// Failed resets at 30m (the series is born at 1) and 91m.
	failures := func(m int) float64 { return float64(1 + m/91) }
	db := minuteSeries(t, []scraped{
		{fmt.Sprintf(`gpu_device_plugin_remediation_state{job=%q, node="n1", gpu="GPU-a", state="needsHuman"}`, job), 0, 200, always},
		{fmt.Sprintf(`gpu_device_plugin_remediation_state{job=%q, node="n1", gpu="GPU-b", state="serving"}`, job), 0, 200, always},
		{fmt.Sprintf(`gpu_device_plugin_remediation_state{job=%q, node="n2", gpu="GPU-c", state="needsReboot"}`, job), 0, 200, always},
		{`gpu_device_plugin_remediation_state{job="other", node="n3", gpu="GPU-d", state="needsHuman"}`, 0, 200, always},
		{`gpu_device_plugin_remediation_state{job="other", node="n3", gpu="GPU-d", state="needsReboot"}`, 0, 200, always},
		{fmt.Sprintf(`gpu_device_plugin_remediation_resets_total{job=%q, node="n1", result="failure"}`, job), 30, 200, failures},
		{fmt.Sprintf(`gpu_device_plugin_remediation_resets_total{job=%q, node="n1", result="success"}`, job), 10, 200, func(m int) float64 { return float64(1 + m/40) }},
		{`gpu_device_plugin_remediation_resets_total{job="other", node="n3", result="failure"}`, 30, 200, failures},
	})
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 100000, Timeout: time.Minute})
	t.Cleanup(func() { engine.Close() })
	for _, tc := range []struct {
		alert string
		at    int // minutes
		want  []string
	}{
		{"GPUDevicePluginGPUNeedsHuman", 100, []string{`{gpu="GPU-a", node="n1", state="needsHuman"} 1`}},
		{"GPUDevicePluginNodeNeedsReboot", 100, []string{`{gpu="GPU-c", node="n2", state="needsReboot"} 1`}},
		{"GPUDevicePluginResetFailing", 20, nil},
		{"GPUDevicePluginResetFailing", 31, []string{`{node="n1", result="failure"} 1`}},  // the first failure
		{"GPUDevicePluginResetFailing", 85, []string{`{node="n1", result="failure"} 1`}},  // within the hour
		{"GPUDevicePluginResetFailing", 100, []string{`{node="n1", result="failure"} 1`}}, // the second
		{"GPUDevicePluginResetFailing", 160, nil},                                         // an hour after the last
	} {
		r, ok := alerts[tc.alert]
		if !ok {
			t.Errorf("no alert %s", tc.alert)
			continue
		}
		got, err := evalAt(engine, db, r.Expr.String(), tc.at)
		if err != nil {
			t.Errorf("%s at %dm: %v", tc.alert, tc.at, err)
		} else if !slices.Equal(got, tc.want) {
			t.Errorf("%s at %dm gives\n  %s\nwant\n  %s", tc.alert, tc.at, strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
		}
	}
}

// evalAt is expr at minute m: each series' labels but __name__ and job
// (the other job's series are the same but for it), and its value,
// rounded.
func evalAt(engine *promql.Engine, db storage.Queryable, expr string, m int) ([]string, error) {
	q, err := engine.NewInstantQuery(context.Background(), db, nil, expr, time.Unix(0, 0).Add(time.Duration(m)*time.Minute))
	if err != nil {
		return nil, err
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		return nil, res.Err
	}
	vec, err := res.Vector()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range vec {
		out = append(out, fmt.Sprintf("%s %.0f", labels.NewBuilder(s.Metric).Del(labels.MetricName, "job").Labels(), s.F))
	}
	slices.Sort(out)
	return out, nil
}

// scraped is a series with a sample each minute from from to to, inclusive.
type scraped struct {
	metric   string // name{label="value", ...}
	from, to int
	value    func(minute int) float64
}

// minuteSeries is a Queryable of series, for Prometheus' engine.
func minuteSeries(t *testing.T, in []scraped) storage.Queryable {
	t.Helper()
	var all []storage.Series
	for _, s := range in {
		l, err := promQL.ParseMetric(s.metric)
		if err != nil {
			t.Fatalf("%s: %v", s.metric, err)
		}
		var samples []chunks.Sample
		for m := s.from; m <= s.to; m++ {
			samples = append(samples, floatSample{t: (time.Duration(m) * time.Minute).Milliseconds(), f: s.value(m)})
		}
		all = append(all, storage.NewListSeries(l, samples))
	}
	return storage.QueryableFunc(func(int64, int64) (storage.Querier, error) {
		return &storage.MockQuerier{SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
			set := &seriesList{i: -1}
			for _, s := range all {
				if matchesAll(s.Labels(), ms) {
					set.series = append(set.series, s)
				}
			}
			slices.SortFunc(set.series, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
			return set
		}}, nil
	})
}

// seriesList is a storage.SeriesSet of series in order.
type seriesList struct {
	series []storage.Series
	i      int
}

func (s *seriesList) Next() bool                        { s.i++; return s.i < len(s.series) }
func (s *seriesList) At() storage.Series                { return s.series[s.i] }
func (s *seriesList) Err() error                        { return nil }
func (s *seriesList) Warnings() annotations.Annotations { return nil }

func matchesAll(l labels.Labels, ms []*labels.Matcher) bool {
	for _, m := range ms {
		if !m.Matches(l.Get(m.Name)) {
			return false
		}
	}
	return true
}

// floatSample is one float sample, at t milliseconds.
type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                      { return s.t }
func (s floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                    { return s.f }
func (s floatSample) H() *histogram.Histogram       { return nil }
func (s floatSample) FH() *histogram.FloatHistogram { return nil }
func (s floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample           { return s }
