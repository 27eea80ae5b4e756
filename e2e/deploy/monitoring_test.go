package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// dashboardComponent labels the Grafana dashboard's ConfigMap.
const dashboardComponent = "dashboard"

// dashboardFile is the dashboard in the chart, which its ConfigMap carries.
var dashboardFile = filepath.Join("dashboards", "gpu-device-plugin.json")

// promQL parses as Prometheus does, with its defaults.
var promQL = parser.NewParser(parser.Options{})

// monitoringValues turns on metrics and every monitoring value, with
// extra over them (one level deep, under metrics).
func monitoringValues(extra map[string]any) chartutil.Values {
	m := map[string]any{
		"enabled":        true,
		"serviceMonitor": map[string]any{"enabled": true},
		"prometheusRule": map[string]any{"enabled": true},
		"dashboard":      map[string]any{"enabled": true},
	}
	for k, v := range extra {
		m[k] = v
	}
	return chartutil.Values{"metrics": m}
}

// withoutMonitoringCRDs is vals with the ServiceMonitor and the
// PrometheusRule off, for a cluster without the Prometheus Operator.
func withoutMonitoringCRDs(vals chartutil.Values) chartutil.Values {
	m, _ := vals["metrics"].(map[string]any)
	if m == nil {
		return vals
	}
	for _, k := range []string{"serviceMonitor", "prometheusRule"} {
		if sub, ok := m[k].(map[string]any); ok {
			sub["enabled"] = false
		}
	}
	return vals
}

// With the defaults and every monitoring value on: a ServiceMonitor that
// scrapes the metrics Service, rules that parse as Prometheus parses them
// and select the job the ServiceMonitor gives, each alert with its text
// and a runbook in docs/troubleshooting.md, and the dashboard, byte for
// byte; every metric they name is one the plugin exports.
func TestHelmMonitoring(t *testing.T) {
	objs, notes := renderNotes(t, monitoringValues(nil))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the chart's objects are not valid:\n%v", errs.ToAggregate())
	}
	if len(objs.Services) != 1 || len(objs.ServiceMonitors) != 1 || len(objs.PrometheusRules) != 1 || len(objs.Dashboards) != 1 || len(objs.ConfigMaps) != 1 {
		t.Fatalf("want the metrics Service, a ServiceMonitor, a PrometheusRule, the dashboard's ConfigMap and the plugin's; got %d, %d, %d, %d, %d",
			len(objs.Services), len(objs.ServiceMonitors), len(objs.PrometheusRules), len(objs.Dashboards), len(objs.ConfigMaps))
	}
	svc, sm, pr, db := objs.Services[0], objs.ServiceMonitors[0], objs.PrometheusRules[0], objs.Dashboards[0]

	t.Run("ServiceMonitor", func(t *testing.T) {
		if sm.Namespace != releaseNamespace {
			t.Errorf("namespace %q, want the release's", sm.Namespace)
		}
		checkSelectsService(t, sm, svc)
		ep := sm.Spec.Endpoints[0]
		if ep.Interval != "30s" || ep.ScrapeTimeout != "10s" || ep.Path != "/metrics" {
			t.Errorf("interval %q, scrapeTimeout %q, path %q; want values.yaml's 30s, 10s and /metrics", ep.Interval, ep.ScrapeTimeout, ep.Path)
		}
		if len(ep.RelabelConfigs) != 1 || len(ep.MetricRelabelConfigs) != 0 {
			t.Errorf("relabelings %+v, metricRelabelings %+v: want the node's only", ep.RelabelConfigs, ep.MetricRelabelConfigs)
		}
	})

	// The job of the plugin's series: the Service's name, as the Prometheus
	// Operator sets it for a ServiceMonitor without jobLabel.
	job := svc.Name
	t.Run("rules", func(t *testing.T) {
		if pr.Namespace != releaseNamespace {
			t.Errorf("namespace %q, want the release's", pr.Namespace)
		}
		if sm.Spec.JobLabel != "" {
			t.Fatalf("the ServiceMonitor sets jobLabel %q: the job is no longer the Service's name", sm.Spec.JobLabel)
		}
		alerts := checkRules(t, pr, job, "https://github.com/gpu-device-plugin/gpu-device-plugin/blob/main/docs/troubleshooting.md")
		// targetAbsent is off by default: it fires where no node has a GPU.
		// The remediation's are on: silent while it is off.
		want := []string{"GPUDevicePluginAPIWritesFailing", "GPUDevicePluginDeviceUnhealthy", "GPUDevicePluginGPUNeedsHuman", "GPUDevicePluginMPSDaemonDown",
			"GPUDevicePluginNodeNeedsReboot", "GPUDevicePluginNotReady", "GPUDevicePluginResetFailing", "GPUDevicePluginTargetDown"}
		if got := slices.Sorted(maps.Keys(alerts)); !slices.Equal(got, want) {
			t.Errorf("alerts %v, want %v", got, want)
		}
		for name, severity := range map[string]string{"GPUDevicePluginDeviceUnhealthy": "warning", "GPUDevicePluginNotReady": "critical",
			"GPUDevicePluginGPUNeedsHuman": "warning", "GPUDevicePluginNodeNeedsReboot": "warning"} {
			if r, ok := alerts[name]; ok && (r.Labels["severity"] != severity || r.For == nil || *r.For == "") {
				t.Errorf("%s: labels %v, for %v; want severity %s and values.yaml's for", name, r.Labels, r.For, severity)
			}
		}
		if r, ok := alerts["GPUDevicePluginDeviceUnhealthy"]; ok && !strings.Contains(r.Annotations["summary"]+r.Annotations["description"], "{{ $labels.reason }}") {
			t.Errorf("GPUDevicePluginDeviceUnhealthy does not say the reason: %v", r.Annotations)
		}
		if r, ok := alerts["GPUDevicePluginAPIWritesFailing"]; ok {
			checkAPIWriteSelector(t, r.Expr.String())
		}
		// The remediation's name the GPU and the node, and say how to look.
		for _, name := range []string{"GPUDevicePluginGPUNeedsHuman", "GPUDevicePluginNodeNeedsReboot", "GPUDevicePluginResetFailing"} {
			r := alerts[name]
			text := r.Annotations["summary"] + r.Annotations["description"]
			for _, w := range []string{"{{ $labels.node }}", "gpu-device-plugin remediation status"} {
				if !strings.Contains(text, w) {
					t.Errorf("%s does not say %q: %v", name, w, r.Annotations)
				}
			}
			if name != "GPUDevicePluginResetFailing" && !strings.Contains(r.Annotations["summary"], "{{ $labels.gpu }}") {
				t.Errorf("%s's summary does not name the GPU: %q", name, r.Annotations["summary"])
			}
		}
		checkRemediationAlerts(t, alerts, job)
	})

	t.Run("dashboard", func(t *testing.T) {
		want := mustRead(t, filepath.Join(chartDir(t), dashboardFile))
		if got := db.Data["gpu-device-plugin.json"]; got != string(want) {
			t.Errorf("the ConfigMap's gpu-device-plugin.json is not %s byte for byte:\n%s", dashboardFile, got)
		}
		if db.Labels["grafana_dashboard"] != "1" || db.Namespace != releaseNamespace || db.Name != "gpu-device-plugin-dashboard" {
			t.Errorf("ConfigMap %s/%s, labels %v: want gpu-device-plugin-dashboard in the release's namespace, labelled grafana_dashboard: \"1\" for Grafana's sidecar", db.Namespace, db.Name, db.Labels)
		}
	})

	for _, want := range []string{"ServiceMonitor gpu-device-plugin", "PrometheusRule gpu-device-plugin", "ConfigMap gpu-device-plugin-dashboard"} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES.txt does not say %q:\n%s", want, notes)
		}
	}
}

// The dashboard is Grafana's JSON: every panel has a query on the
// dashboard's data source, every query parses as PromQL once Grafana's
// variables are filled in, and names only metrics the plugin exports.
func TestDashboard(t *testing.T) {
	data := mustRead(t, filepath.Join(chartDir(t), dashboardFile))
	var d struct {
		UID, Title string
		Panels     []struct {
			ID         int
			Type       string
			Title      string
			Datasource *struct{ Type, UID string }
			GridPos    *struct{ H, W, X, Y int }
			Targets    []struct {
				Expr  string
				RefID string
			}
		}
		Templating struct {
			List []struct {
				Name, Type string
				Query      any
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil || dec.More() {
		t.Fatalf("%s is not one JSON object: %v", dashboardFile, err)
	}
	if !bytes.HasSuffix(data, []byte("}\n")) || bytes.HasSuffix(data, []byte("\n\n")) {
		t.Errorf("%s should end in exactly one newline (the ConfigMap's literal block keeps one)", dashboardFile)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: Grafana's sidecar needs both", d.UID, d.Title)
	}
	known := exportedMetrics(t)
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		m := regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`).FindStringSubmatch(s)
		if m == nil {
			t.Errorf("variable %s: query %q, want label_values(SELECTOR, LABEL)", v.Name, v.Query)
			continue
		}
		checkPromQL(t, known, "variable "+v.Name, m[1], nil)
	}
	if vars["datasource"] != "datasource" || vars["job"] != "query" || vars["node"] != "query" {
		t.Errorf("variables %v, want datasource, job and node", vars)
	}
	ids := map[int]bool{}
	queries := 0
	var exprs []string
	for _, p := range d.Panels {
		what := fmt.Sprintf("panel %d (%s)", p.ID, p.Title)
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("%s: id missing or used twice", what)
		}
		ids[p.ID] = true
		if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("%s: gridPos %+v", what, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 || p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: %d queries, data source %+v; want queries on ${datasource}", what, len(p.Targets), p.Datasource)
		}
		for _, tg := range p.Targets {
			queries++
			exprs = append(exprs, tg.Expr)
			// Grafana fills in the interval; $job and $node sit in regexes.
			expr := regexp.MustCompile(`\$__\w+`).ReplaceAllString(tg.Expr, "5m")
			checkPromQL(t, known, what, expr, func(vs *parser.VectorSelector) error {
				for _, l := range []string{"job", "node"} {
					if m := matcher(vs, l); m == nil || m.Type != labels.MatchRegexp || m.Value != "$"+l {
						return fmt.Errorf("%s does not select %s=~\"$%s\" (the dashboard's variable)", vs, l, l)
					}
				}
				return nil
			})
		}
	}
	if queries < 10 {
		t.Errorf("%d queries: the panels of devices, transitions, allocation, MPS, API requests and readiness are not all there", queries)
	}
	// The remediation's: GPUs per state, resets by result, time to recover.
	all := strings.Join(exprs, "\n")
	for _, want := range []string{"by (state) (gpu_device_plugin_remediation_state", "by (node, result) (increase(gpu_device_plugin_remediation_resets_total",
		"histogram_quantile(0.5, sum by (le) (increase(gpu_device_plugin_remediation_recovery_seconds_bucket"} {
		if !strings.Contains(all, want) {
			t.Errorf("no panel queries %s...", want)
		}
	}
}

// The metric names the plugin exports, from its source: the names given
// to an exposition.Desc (Name:), under internal/, and a histogram's series
// (_bucket, _sum, _count) for those given to exposition.NewHistogram. A
// metric renamed there and not here fails TestHelmMonitoring and
// TestDashboard.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`Name:\s*"(gpu_device_plugin_[a-z0-9_]+)"`)
	histogram := regexp.MustCompile(`NewHistogram\(\s*exposition\.Desc\{\s*Name:\s*"(gpu_device_plugin_[a-z0-9_]+)"`)
	names := map[string]bool{}
	root := repoPath(t, "internal")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllSubmatch(src, -1) {
			names[string(m[1])] = true
		}
		for _, m := range histogram.FindAllSubmatch(src, -1) {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[string(m[1])+suffix] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The scan itself works: these have been exported all along.
	for _, n := range []string{"gpu_device_plugin_device_healthy", "gpu_device_plugin_health_transitions_total", "gpu_device_plugin_api_requests_total", "gpu_device_plugin_mps_daemon_up",
		"gpu_device_plugin_remediation_state", "gpu_device_plugin_remediation_resets_total", "gpu_device_plugin_remediation_recovery_seconds_bucket"} {
		if !names[n] {
			t.Fatalf("no %s in internal/: the scan for metric names (%s) finds %v", n, re, slices.Sorted(maps.Keys(names)))
		}
	}
	return names
}

// checkPromQL parses expr as Prometheus does and checks that each metric
// it selects is exported by the plugin (or is up, the scrape's own), and
// passes check, when given.
func checkPromQL(t *testing.T, known map[string]bool, what, expr string, check func(*parser.VectorSelector) error) {
	t.Helper()
	e, err := promQL.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %q does not parse: %v", what, expr, err)
		return
	}
	selectors := 0
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		selectors++
		if vs.Name == "" {
			t.Errorf("%s: %s selects no metric by name", what, vs)
		} else if vs.Name != "up" && !known[vs.Name] {
			t.Errorf("%s: %s: the plugin exports no metric %s (internal/observe/metrics)", what, expr, vs.Name)
		}
		if check != nil {
			if err := check(vs); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
		return nil
	})
	if selectors == 0 {
		t.Errorf("%s: %q selects nothing", what, expr)
	}
}

// matcher is vs's matcher of label name, or nil.
func matcher(vs *parser.VectorSelector, name string) *labels.Matcher {
	for _, m := range vs.LabelMatchers {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// checkSelectsService: sm scrapes svc's port by name, selecting it by its
// labels in its namespace, and labels each series with the pod's node.
func checkSelectsService(t *testing.T, sm *monitoringv1.ServiceMonitor, svc *corev1.Service) {
	t.Helper()
	sel := sm.Spec.Selector
	if len(sel.MatchLabels) == 0 || len(sel.MatchExpressions) != 0 {
		t.Errorf("selector %+v, want matchLabels only", sel)
	}
	for k, v := range sel.MatchLabels {
		if svc.Labels[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s; the Service %s has %q", k, v, svc.Name, svc.Labels[k])
		}
	}
	if ns := sm.Spec.NamespaceSelector; ns.Any || !slices.Equal(ns.MatchNames, []string{svc.Namespace}) {
		t.Errorf("namespaceSelector %+v, want the Service's namespace %s", ns, svc.Namespace)
	}
	if len(sm.Spec.Endpoints) != 1 || len(svc.Spec.Ports) != 1 || sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name {
		t.Fatalf("endpoints %+v, want one on the Service's port %+v, by name", sm.Spec.Endpoints, svc.Spec.Ports)
	}
	node := slices.ContainsFunc(sm.Spec.Endpoints[0].RelabelConfigs, func(r monitoringv1.RelabelConfig) bool {
		return slices.Equal(r.SourceLabels, []monitoringv1.LabelName{"__meta_kubernetes_pod_node_name"}) && r.TargetLabel == "node"
	})
	if !node {
		t.Errorf("relabelings %+v do not set node from __meta_kubernetes_pod_node_name (the dashboard and alerts need it)", sm.Spec.Endpoints[0].RelabelConfigs)
	}
}

// checkRules checks pr's alerts (one group) and returns them by name:
// each selects job, names only exported metrics, and has a summary, a
// description and a runbook_url under runbook whose anchor is a section of
// docs/troubleshooting.md.
func checkRules(t *testing.T, pr *monitoringv1.PrometheusRule, job, runbook string) map[string]monitoringv1.Rule {
	t.Helper()
	anchors := markdownAnchors(t, repoPath(t, "docs", "troubleshooting.md"))
	known := exportedMetrics(t)
	if len(pr.Spec.Groups) != 1 {
		t.Fatalf("%d rule groups, want 1", len(pr.Spec.Groups))
	}
	out := map[string]monitoringv1.Rule{}
	for _, r := range pr.Spec.Groups[0].Rules {
		if r.Alert == "" {
			t.Errorf("rule %s is not an alert", r.Expr.String())
			continue
		}
		if _, dup := out[r.Alert]; dup {
			t.Errorf("alert %s twice", r.Alert)
		}
		out[r.Alert] = r
		checkPromQL(t, known, r.Alert, r.Expr.String(), func(vs *parser.VectorSelector) error {
			if m := matcher(vs, "job"); m == nil || m.Type != labels.MatchEqual || m.Value != job {
				return fmt.Errorf("%s does not select job=%q", vs, job)
			}
			return nil
		})
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s has no %s", r.Alert, a)
			}
		}
		page, anchor, _ := strings.Cut(r.Annotations["runbook_url"], "#")
		if page != runbook || !anchors[anchor] {
			t.Errorf("%s: runbook_url %q, want %s#<a section of docs/troubleshooting.md>; its sections are %v", r.Alert, r.Annotations["runbook_url"], runbook, slices.Sorted(maps.Keys(anchors)))
		}
		if r.Labels["severity"] == "" {
			t.Errorf("%s has no severity", r.Alert)
		}
	}
	return out
}

// checkAPIWriteSelector: the API alert counts the verbs the plugin writes
// with (internal/kubeapi: create and patch; get is a read) and the
// failures among their answers: 5xx, error (none), 4xx but 404 and 409.
func checkAPIWriteSelector(t *testing.T, expr string) {
	t.Helper()
	e, err := promQL.ParseExpr(expr)
	if err != nil {
		t.Fatal(err)
	}
	var vs *parser.VectorSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if v, ok := n.(*parser.VectorSelector); ok {
			vs = v
		}
		return nil
	})
	matches := func(label, value string) bool {
		for _, m := range vs.LabelMatchers {
			if m.Name == label && !m.Matches(value) {
				return false
			}
		}
		return true
	}
	for verb, want := range map[string]bool{"create": true, "patch": true, "get": false} {
		if matches("verb", verb) != want {
			t.Errorf("%s: verb %s counted %v, want %v", expr, verb, !want, want)
		}
	}
	for code, want := range map[string]bool{"500": true, "503": true, "error": true, "403": true, "422": true, "429": true, "404": false, "409": false, "201": false, "200": false} {
		if matches("code", code) != want {
			t.Errorf("%s: code %s counted as a failure %v, want %v", expr, code, !want, want)
		}
	}
}

// markdownAnchors are the anchors GitHub gives a page's headings.
func markdownAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	fenced := false
	for _, line := range strings.Split(string(mustRead(t, path)), "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if h, ok := strings.CutPrefix(line, "#"); ok && !fenced {
			h = strings.TrimLeft(h, "#")
			out[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")] = true
		}
	}
	return out
}

// Every monitoring value of values-all.yaml reaches its object.
func TestHelmMonitoringEveryOption(t *testing.T) {
	objs := renderWith(t, readValues(t, filepath.Join("testdata", "values-all.yaml")))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the chart's objects are not valid:\n%v", errs.ToAggregate())
	}
	if len(objs.ServiceMonitors) != 1 || len(objs.PrometheusRules) != 1 || len(objs.Dashboards) != 1 {
		t.Fatalf("%d ServiceMonitors, %d PrometheusRules, %d dashboards; want one each", len(objs.ServiceMonitors), len(objs.PrometheusRules), len(objs.Dashboards))
	}
	svc, sm, pr, db := objs.Services[0], objs.ServiceMonitors[0], objs.PrometheusRules[0], objs.Dashboards[0]
	check := func(what string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("%s: not rendered as set", what)
		}
	}
	checkSelectsService(t, sm, svc)
	ep := sm.Spec.Endpoints[0]
	check("serviceMonitor.namespace", sm.Namespace == "monitoring")
	check("serviceMonitor.labels", sm.Labels["release"] == "prometheus" && sm.Labels["app.kubernetes.io/name"] == "gpuplugin")
	check("serviceMonitor.interval", ep.Interval == "15s")
	check("serviceMonitor.scrapeTimeout", ep.ScrapeTimeout == "5s")
	check("serviceMonitor.relabelings, after the node's", len(ep.RelabelConfigs) == 2 && ep.RelabelConfigs[1].TargetLabel == "tier")
	check("serviceMonitor.metricRelabelings", len(ep.MetricRelabelConfigs) == 1 && ep.MetricRelabelConfigs[0].Action == "drop")

	check("prometheusRule.namespace", pr.Namespace == "monitoring")
	check("prometheusRule.labels", pr.Labels["release"] == "prometheus")
	alerts := checkRules(t, pr, "gpu-plugins", "https://wiki.example.com/gpu/troubleshooting")
	_, mps := alerts["GPUDevicePluginMPSDaemonDown"]
	_, absent := alerts["GPUDevicePluginTargetAbsent"]
	_, reboot := alerts["GPUDevicePluginNodeNeedsReboot"]
	check("prometheusRule.alerts.*.enabled", len(alerts) == 7 && !mps && absent && !reboot)
	for name, r := range alerts {
		check("prometheusRule.alertLabels ("+name+")", r.Labels["team"] == "ml-platform")
	}
	forOf := func(name string) string {
		if r, ok := alerts[name]; ok && r.For != nil {
			return string(*r.For)
		}
		return ""
	}
	check("alerts.deviceUnhealthy", forOf("GPUDevicePluginDeviceUnhealthy") == "10m" && alerts["GPUDevicePluginDeviceUnhealthy"].Labels["severity"] == "critical")
	check("alerts.notReady", forOf("GPUDevicePluginNotReady") == "5m" && alerts["GPUDevicePluginNotReady"].Labels["severity"] == "warning")
	check("alerts.targetDown", forOf("GPUDevicePluginTargetDown") == "5m")
	check("alerts.targetAbsent", forOf("GPUDevicePluginTargetAbsent") == "30m")
	api := alerts["GPUDevicePluginAPIWritesFailing"]
	check("alerts.apiWritesFailing", forOf("GPUDevicePluginAPIWritesFailing") == "30m" &&
		strings.Contains(api.Expr.String(), "[1h]") && strings.HasSuffix(api.Expr.String(), "> 5") && strings.Contains(api.Annotations["description"], "1h"))
	check("alerts.gpuNeedsHuman", forOf("GPUDevicePluginGPUNeedsHuman") == "15m" && alerts["GPUDevicePluginGPUNeedsHuman"].Labels["severity"] == "critical")
	reset := alerts["GPUDevicePluginResetFailing"]
	check("alerts.resetFailing", forOf("GPUDevicePluginResetFailing") == "10m" && reset.Labels["severity"] == "critical" &&
		strings.Contains(reset.Expr.String(), "[6h]") && strings.Contains(reset.Expr.String(), "offset 6h") && strings.Count(reset.Expr.String(), "> 2") == 2 &&
		strings.Contains(reset.Annotations["description"], "6h"))

	check("dashboard.namespace", db.Namespace == "grafana")
	check("dashboard.labels", db.Labels["grafana_dashboard"] == "1" && db.Labels["example.com/team"] == "ml-platform" && db.Labels["app.kubernetes.io/component"] == dashboardComponent)
	check("dashboard.annotations", db.Annotations["grafana_folder"] == "GPU")
}

// A ServiceMonitor or PrometheusRule on a cluster without the Prometheus
// Operator's CRDs stops the install in one line that names the CRD and
// the value that turns it off; the dashboard, a ConfigMap, needs none.
func TestHelmMonitoringNeedsCRDs(t *testing.T) {
	c := loadChart(t)
	off := map[string]any{"enabled": false}
	for _, tc := range []struct {
		name string
		vals chartutil.Values
		want []string
	}{
		{"ServiceMonitor", monitoringValues(map[string]any{"prometheusRule": off, "dashboard": off}),
			[]string{"servicemonitors.monitoring.coreos.com", "metrics.serviceMonitor.enabled=false", "--api-versions monitoring.coreos.com/v1/ServiceMonitor"}},
		{"PrometheusRule", monitoringValues(map[string]any{"serviceMonitor": off, "dashboard": off}),
			[]string{"prometheusrules.monitoring.coreos.com", "metrics.prometheusRule.enabled=false", "--api-versions monitoring.coreos.com/v1/PrometheusRule"}},
		{"both", monitoringValues(nil),
			[]string{"servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderOn(t, c, withUserImage(tc.vals), kubeVersion, nil)
			if err == nil {
				t.Fatal("renders without the CRDs")
			}
			checkOneLine(t, err, tc.want...)
		})
	}
	t.Run("only the other CRD", func(t *testing.T) {
		_, err := renderOn(t, c, withUserImage(monitoringValues(nil)), kubeVersion, []string{"monitoring.coreos.com/v1", "monitoring.coreos.com/v1/PrometheusRule"})
		if err == nil || strings.Contains(err.Error(), "prometheusrules") {
			t.Fatalf("%v, want only the ServiceMonitor's CRD named", err)
		}
		checkOneLine(t, err, "servicemonitors.monitoring.coreos.com")
	})
	t.Run("dashboard", func(t *testing.T) {
		out, err := renderOn(t, c, withUserImage(monitoringValues(map[string]any{"serviceMonitor": off, "prometheusRule": off})), kubeVersion, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out["gpu-device-plugin/templates/dashboard.yaml"], "grafana_dashboard") {
			t.Errorf("no dashboard:\n%s", out["gpu-device-plugin/templates/dashboard.yaml"])
		}
	})
}

// checkOneLine: err is one line that says each of want.
func checkOneLine(t *testing.T, err error, want ...string) {
	t.Helper()
	msg := err.Error()
	// Helm prefixes the template's name and position; the message is ours.
	if strings.Contains(msg, "\n") {
		t.Errorf("%q: want one line", msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("%q does not say %q", msg, w)
		}
	}
}

// A missing prerequisite or a value of the wrong type stops the install in
// one line naming the value and the fix.
func TestHelmMonitoringRefuses(t *testing.T) {
	on := map[string]any{"enabled": true}
	alerts := func(name string, a map[string]any) map[string]any {
		return map[string]any{"enabled": true, "alerts": map[string]any{name: a}}
	}
	for _, tc := range []struct {
		name string
		vals chartutil.Values
		want []string
	}{
		{"ServiceMonitor without metrics", chartutil.Values{"metrics": map[string]any{"serviceMonitor": on}},
			[]string{"metrics.serviceMonitor.enabled", "set metrics.enabled=true too"}},
		{"ServiceMonitor without the Service", monitoringValues(map[string]any{"service": map[string]any{"enabled": false}}),
			[]string{"metrics.serviceMonitor.enabled", "set metrics.service.enabled=true too"}},
		{"ServiceMonitor of a loopback address", monitoringValues(map[string]any{"bindAddress": "127.0.0.1"}),
			[]string{"metrics.bindAddress 127.0.0.1", "loopback", "leave metrics.bindAddress empty"}},
		{"PrometheusRule without metrics", chartutil.Values{"metrics": map[string]any{"prometheusRule": on}},
			[]string{"metrics.prometheusRule.enabled", "set metrics.enabled=true too"}},
		{"dashboard without metrics", chartutil.Values{"metrics": map[string]any{"dashboard": on}},
			[]string{"metrics.dashboard.enabled", "set metrics.enabled=true too"}},
		{"every alert off", monitoringValues(map[string]any{"prometheusRule": map[string]any{"enabled": true, "alerts": map[string]any{
			"deviceUnhealthy": map[string]any{"enabled": false}, "notReady": map[string]any{"enabled": false}, "targetDown": map[string]any{"enabled": false},
			"mpsDaemonDown": map[string]any{"enabled": false}, "apiWritesFailing": map[string]any{"enabled": false},
			"gpuNeedsHuman": map[string]any{"enabled": false}, "nodeNeedsReboot": map[string]any{"enabled": false}, "resetFailing": map[string]any{"enabled": false}}}}),
			[]string{"every alert off", "metrics.prometheusRule.enabled=false"}},
		{"enabled a string", monitoringValues(map[string]any{"serviceMonitor": map[string]any{"enabled": "false"}}),
			[]string{`metrics.serviceMonitor.enabled "false"`, "want true or false"}},
		{"interval a number", monitoringValues(map[string]any{"serviceMonitor": map[string]any{"enabled": true, "interval": 30}}),
			[]string{"metrics.serviceMonitor.interval 30", "Prometheus duration"}},
		{"scrapeTimeout in words", monitoringValues(map[string]any{"serviceMonitor": map[string]any{"enabled": true, "scrapeTimeout": "10 seconds"}}),
			[]string{`metrics.serviceMonitor.scrapeTimeout "10 seconds"`, "Prometheus duration"}},
		{"labels a string", monitoringValues(map[string]any{"serviceMonitor": map[string]any{"enabled": true, "labels": "release=prometheus"}}),
			[]string{"metrics.serviceMonitor.labels", "want a map"}},
		{"a label a number", monitoringValues(map[string]any{"prometheusRule": map[string]any{"enabled": true, "alertLabels": map[string]any{"tier": 1}}}),
			[]string{"metrics.prometheusRule.alertLabels.tier 1", "want a string", `"1"`}},
		{"relabelings a map", monitoringValues(map[string]any{"serviceMonitor": map[string]any{"enabled": true, "relabelings": map[string]any{"action": "drop"}}}),
			[]string{"metrics.serviceMonitor.relabelings", "want a list"}},
		{"an alert unknown", monitoringValues(map[string]any{"prometheusRule": alerts("deviceUnhealty", map[string]any{"enabled": true})}),
			[]string{"metrics.prometheusRule.alerts.deviceUnhealty", "no such alert", "deviceUnhealthy"}},
		{"for in words", monitoringValues(map[string]any{"prometheusRule": alerts("notReady", map[string]any{"for": "10 minutes"})}),
			[]string{`metrics.prometheusRule.alerts.notReady.for "10 minutes"`, "Prometheus duration such as 5m"}},
		{"for empty", monitoringValues(map[string]any{"prometheusRule": alerts("notReady", map[string]any{"for": ""})}),
			[]string{`metrics.prometheusRule.alerts.notReady.for ""`, "Prometheus duration"}},
		{"severity empty", monitoringValues(map[string]any{"prometheusRule": alerts("targetDown", map[string]any{"severity": ""})}),
			[]string{"metrics.prometheusRule.alerts.targetDown.severity", "warning or critical"}},
		{"threshold a string", monitoringValues(map[string]any{"prometheusRule": alerts("apiWritesFailing", map[string]any{"threshold": "5"})}),
			[]string{`metrics.prometheusRule.alerts.apiWritesFailing.threshold "5"`, "want a number"}},
		{"threshold negative", monitoringValues(map[string]any{"prometheusRule": alerts("apiWritesFailing", map[string]any{"threshold": -1})}),
			[]string{"metrics.prometheusRule.alerts.apiWritesFailing.threshold -1", "0 or more"}},
		{"window a number", monitoringValues(map[string]any{"prometheusRule": alerts("apiWritesFailing", map[string]any{"window": 15})}),
			[]string{"metrics.prometheusRule.alerts.apiWritesFailing.window 15", "Prometheus duration"}},
		{"reset threshold negative", monitoringValues(map[string]any{"prometheusRule": alerts("resetFailing", map[string]any{"threshold": -1})}),
			[]string{"metrics.prometheusRule.alerts.resetFailing.threshold -1", "0 or more (failed resets within window)"}},
		{"reset window empty", monitoringValues(map[string]any{"prometheusRule": alerts("resetFailing", map[string]any{"window": ""})}),
			[]string{`metrics.prometheusRule.alerts.resetFailing.window ""`, "Prometheus duration such as 1h"}},
		{"job a number", monitoringValues(map[string]any{"prometheusRule": map[string]any{"enabled": true, "job": 5}}),
			[]string{"metrics.prometheusRule.job 5", "want a string"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderValues(t, loadChart(t), tc.vals)
			if err == nil {
				t.Fatal("renders")
			}
			checkOneLine(t, err, tc.want...)
		})
	}
	// The values that may be empty are: an interval of Prometheus' own.
	objs := renderWith(t, monitoringValues(map[string]any{"serviceMonitor": map[string]any{"enabled": true, "interval": "", "scrapeTimeout": ""}}))
	if ep := objs.ServiceMonitors[0].Spec.Endpoints[0]; ep.Interval != "" || ep.ScrapeTimeout != "" {
		t.Errorf("interval %q, scrapeTimeout %q; want none", ep.Interval, ep.ScrapeTimeout)
	}
}

// validateServiceMonitor checks what the Prometheus Operator reads from a
// ServiceMonitor's endpoints: Prometheus durations, relabel actions it
// knows, regexes that compile.
func validateServiceMonitor(sm *monitoringv1.ServiceMonitor) field.ErrorList {
	var errs field.ErrorList
	actions := []string{"replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase", "uppercase", "keepequal", "dropequal"}
	for i, ep := range sm.Spec.Endpoints {
		p := field.NewPath("spec", "endpoints").Index(i)
		for name, d := range map[string]monitoringv1.Duration{"interval": ep.Interval, "scrapeTimeout": ep.ScrapeTimeout} {
			if d == "" {
				continue
			}
			if _, err := model.ParseDuration(string(d)); err != nil {
				errs = append(errs, field.Invalid(p.Child(name), d, err.Error()))
			}
		}
		for kind, rcs := range map[string][]monitoringv1.RelabelConfig{"relabelings": ep.RelabelConfigs, "metricRelabelings": ep.MetricRelabelConfigs} {
			for j, rc := range rcs {
				rp := p.Child(kind).Index(j)
				if rc.Action != "" && !slices.Contains(actions, strings.ToLower(rc.Action)) {
					errs = append(errs, field.NotSupported(rp.Child("action"), rc.Action, actions))
				}
				if _, err := regexp.Compile("^(?:" + rc.Regex + ")$"); err != nil {
					errs = append(errs, field.Invalid(rp.Child("regex"), rc.Regex, err.Error()))
				}
				if a := strings.ToLower(rc.Action); (a == "" || a == "replace") && rc.TargetLabel == "" {
					errs = append(errs, field.Required(rp.Child("targetLabel"), "replace needs a target label"))
				}
			}
		}
	}
	return errs
}

// validatePrometheusRule checks a PrometheusRule's groups as the
// Prometheus Operator's admission webhook does: with Prometheus' own rule
// file parser, which parses each expression and each annotation's
// template.
func validatePrometheusRule(pr *monitoringv1.PrometheusRule) field.ErrorList {
	content, err := yaml.Marshal(pr.Spec)
	if err != nil {
		return field.ErrorList{field.InternalError(field.NewPath("spec"), err)}
	}
	_, perrs := rulefmt.Parse(content, false, model.UTF8Validation, promQL)
	var errs field.ErrorList
	for _, e := range perrs {
		errs = append(errs, field.Invalid(field.NewPath("spec", "groups"), "", e.Error()))
	}
	return errs
}

// The validation above refuses what Prometheus would.
func TestValidateMonitoringRefuses(t *testing.T) {
	pr := &monitoringv1.PrometheusRule{}
	for _, tc := range []struct{ name, rule, want string }{
		{"unbalanced", "{alert: A, expr: 'sum(up'}", "unclosed left parenthesis"},
		{"broken template", "{alert: A, expr: 'up == 0', annotations: {summary: '{{ $labels.node }'}}", "template"},
		{"bad for", "{alert: A, expr: 'up == 0', for: '5 minutes'}", "5 minutes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := yaml.UnmarshalStrict([]byte("groups: [{name: g, rules: ["+tc.rule+"]}]"), &pr.Spec); err != nil {
				t.Fatal(err)
			}
			errs := validatePrometheusRule(pr)
			if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.want) {
				t.Errorf("%v, want an error saying %q", errs.ToAggregate(), tc.want)
			}
		})
	}
	sm := &monitoringv1.ServiceMonitor{}
	if err := yaml.UnmarshalStrict([]byte("endpoints: [{port: metrics, interval: 30sec, relabelings: [{action: replace}, {action: dropp, regex: '('}]}]"), &sm.Spec); err != nil {
		t.Fatal(err)
	}
	got := validateServiceMonitor(sm).ToAggregate().Error()
	for _, want := range []string{"interval", "targetLabel", `"dropp"`, "regex"} {
		if !strings.Contains(got, want) {
			t.Errorf("%s, want it to say %s", got, want)
		}
	}
}

// install.md's table names every alert the chart has, and the docs name no
// alert it lacks.
func TestMonitoringDocsNameRealAlerts(t *testing.T) {
	alertRE := regexp.MustCompile(`GPUDevicePlugin[A-Z]\w*`)
	var alerts []string
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\w+)$`).FindAllStringSubmatch(string(mustRead(t, filepath.Join(chartDir(t), "templates", "prometheusrule.yaml"))), -1) {
		alerts = append(alerts, m[1])
	}
	if len(alerts) != 9 {
		t.Fatalf("alerts %v in prometheusrule.yaml, want 9", alerts)
	}
	install := string(mustRead(t, repoPath(t, "docs", "install.md")))
	for _, a := range alerts {
		if !strings.Contains(install, "| `"+a+"` |") {
			t.Errorf("docs/install.md's Monitoring table has no row for %s", a)
		}
	}
	for _, doc := range []string{"install.md", "troubleshooting.md"} {
		for _, a := range alertRE.FindAllString(string(mustRead(t, repoPath(t, "docs", doc))), -1) {
			if !slices.Contains(alerts, a) {
				t.Errorf("docs/%s names alert %s, which the chart does not have", doc, a)
			}
		}
	}
}
