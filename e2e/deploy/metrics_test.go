package deploy

import (
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
)

// /metrics has no authentication. In the pod's own network it listens on
// the pod's address; in the host's network (hostNetwork, NIC pools) on the
// node's IP only, which the Service reaches and the host's other
// interfaces do not; metrics.bindAddress picks an IP instead. Each form
// starts, as the kubelet expands it, on IPv4 and IPv6 nodes.
func TestHelmMetricsAddress(t *testing.T) {
	metrics := func(extra map[string]any) map[string]any {
		m := map[string]any{"enabled": true}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	pools := nicPoolValues(t)["config"]
	noSurge := map[string]any{"updateStrategy": map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxSurge": 0, "maxUnavailable": 1}}}
	for _, tc := range []struct {
		name   string
		vals   chartutil.Values
		want   string // --metrics-address, as rendered
		hostIP bool   // HOST_IP from the downward API
		notes  string
	}{
		{"pod network: the pod's address", chartutil.Values{"metrics": metrics(nil)}, ":9400", false, "port 9400 of each pod, Service"},
		{"hostNetwork: the node's IP only", chartutil.Values{"metrics": metrics(nil), "hostNetwork": true}, "[$(HOST_IP)]:9400", true, "on its node's IP only"},
		{"NIC pools: the node's IP only", chartutil.Values{"metrics": metrics(nil), "config": pools}, "[$(HOST_IP)]:9400", true, "on its node's IP only"},
		{"DRA mode, hostNetwork: the node's IP only", draValues(chartutil.Values{"metrics": metrics(nil), "hostNetwork": true, "dra": noSurge}), "[$(HOST_IP)]:9400", true, "on its node's IP only"},
		{"loopback", chartutil.Values{"metrics": metrics(map[string]any{"bindAddress": "127.0.0.1"}), "hostNetwork": true}, "127.0.0.1:9400", false, "on 127.0.0.1"},
		{"every interface", chartutil.Values{"metrics": metrics(map[string]any{"bindAddress": "0.0.0.0"}), "hostNetwork": true}, "0.0.0.0:9400", false, "on 0.0.0.0"},
		{"an IPv6 address, bracketed", chartutil.Values{"metrics": metrics(map[string]any{"bindAddress": "fd00::5", "port": 9500})}, "[fd00::5]:9500", false, "on fd00::5"},
		{"IPv6 every interface", chartutil.Values{"metrics": metrics(map[string]any{"bindAddress": "::"}), "hostNetwork": true}, "[::]:9400", false, "on ::"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, notes := renderNotes(t, tc.vals)
			if errs := objs.validate(); len(errs) > 0 {
				t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
			}
			ds, cm := objs.DaemonSets[0], objs.ConfigMaps[0]
			c := ds.Spec.Template.Spec.Containers[0]
			if got, _ := flagValue(c.Args, "metrics-address"); got != tc.want {
				t.Errorf("--metrics-address=%s, want %s", got, tc.want)
			}
			checkHostIPEnv(t, c, tc.hostIP)
			if !strings.Contains(notes, tc.notes) {
				t.Errorf("NOTES.txt does not say %q:\n%s", tc.notes, notes)
			}
			for _, ip := range []string{"10.0.0.5", "fd00::5"} {
				t.Run("accepted by the plugin on "+ip, func(t *testing.T) { checkAcceptedByPluginOn(t, ds, cm, ip) })
			}
		})
	}

	t.Run("off", func(t *testing.T) {
		c := renderWith(t, chartutil.Values{"hostNetwork": true}).DaemonSets[0].Spec.Template.Spec.Containers[0]
		if v, ok := flagValue(c.Args, "metrics-address"); ok {
			t.Errorf("--metrics-address=%s with metrics off", v)
		}
		checkHostIPEnv(t, c, false)
	})

	for _, bad := range []string{"10.0.0.5:9400", "[fd00::5]", "node-1.example.com", "0.0.0.0 "} {
		vals := chartutil.Values{"metrics": metrics(map[string]any{"bindAddress": bad})}
		_, err := renderValues(t, loadChart(t), vals)
		if err == nil || !strings.Contains(err.Error(), "metrics.bindAddress") || !strings.Contains(err.Error(), "metrics.port") {
			t.Errorf("metrics.bindAddress %q: %v, want an error naming metrics.bindAddress and metrics.port", bad, err)
		}
	}
}

// checkHostIPEnv: HOST_IP is set once, from status.hostIP, when want.
func checkHostIPEnv(t *testing.T, c corev1.Container, want bool) {
	t.Helper()
	var found []corev1.EnvVar
	for _, e := range c.Env {
		if e.Name == "HOST_IP" {
			found = append(found, e)
		}
	}
	switch {
	case !want && len(found) > 0:
		t.Errorf("HOST_IP set (%+v), but --metrics-address does not use it", found)
	case want && (len(found) != 1 || found[0].ValueFrom == nil || found[0].ValueFrom.FieldRef == nil || found[0].ValueFrom.FieldRef.FieldPath != "status.hostIP"):
		t.Errorf("HOST_IP is %+v, want it once, from the downward API's status.hostIP", found)
	}
}
