package deploy

import (
	"fmt"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
)

// minKubeVersion is the oldest Kubernetes the default install (the
// device-plugin API, labels through NFD's feature file, no API access)
// runs on: Chart.yaml's kubeVersion, which helm install checks itself.
const minKubeVersion = "1.27"

// at is a KubeVersion as the API server reports it.
func at(v string) chartutil.KubeVersion {
	major, rest, _ := strings.Cut(strings.TrimPrefix(v, "v"), ".")
	minor, _, _ := strings.Cut(rest, ".")
	return chartutil.KubeVersion{Version: v, Major: major, Minor: minor}
}

// Chart.yaml's kubeVersion is the default install's minimum; a feature
// that needs a later Kubernetes stops the install in one line that names
// it and the version, below that version only (a vendor's suffix counts
// as the release it follows).
func TestHelmKubeVersion(t *testing.T) {
	c := loadChart(t)
	for v, ok := range map[string]bool{"v" + minKubeVersion + ".0": true, "v1.37.0": true, "v1.26.15": false} {
		if got := chartutil.IsCompatibleRange(c.Metadata.KubeVersion, v); got != ok {
			t.Errorf("Chart.yaml kubeVersion %q accepts %s: %v, want %v", c.Metadata.KubeVersion, v, got, ok)
		}
	}
	nodeCondition := chartutil.Values{"nodeCondition": map[string]any{"enabled": true}}
	for _, tc := range []struct {
		name    string
		vals    chartutil.Values
		min     string // the first minor it renders on
		feature string // what the error names; "" when min is the chart's
	}{
		{"the default install", nil, minKubeVersion, ""},
		{"events", chartutil.Values{"events": map[string]any{"enabled": true}}, minKubeVersion, ""},
		{"nodeCondition without its admission policy", chartutil.Values{"nodeCondition": map[string]any{"enabled": true, "restrictToOwnNode": false,
			"restrictToOwnNodeAcknowledged": "a stolen token can patch every Node's status"}}, minKubeVersion, ""},
		{"nodeCondition", nodeCondition, "1.32", "nodeCondition.restrictToOwnNode"},
		{"nodeLabels mode node", chartutil.Values{"nodeLabels": map[string]any{"mode": "node"}}, "1.32", "nodeLabels.mode node"},
		{"nodeLabels mode nodefeature", chartutil.Values{"nodeLabels": map[string]any{"mode": "nodefeature"}}, "1.32", "nodeLabels.mode nodefeature"},
		{"remediation.cordon", chartutil.Values{"remediation": map[string]any{"cordon": true}}, "1.32", "remediation.cordon"},
		{"DRA mode", draValues(nil), "1.34", "kubeletAPI dra"},
		{"DRA mode and nodeCondition", draValues(nodeCondition), "1.34", "kubeletAPI dra"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var minor int
			fmt.Sscanf(tc.min, "1.%d", &minor)
			for _, v := range []string{"v" + tc.min + ".0", "v" + tc.min + ".3-eks-4f1e2d", "v1.37.0"} {
				if _, err := renderFor(t, c, withUserImage(tc.vals), at(v)); err != nil {
					t.Errorf("on Kubernetes %s: %v", v, err)
				}
			}
			if tc.feature == "" {
				return
			}
			below := fmt.Sprintf("v1.%d.9", minor-1)
			_, err := renderFor(t, c, withUserImage(tc.vals), at(below))
			if err == nil {
				t.Fatalf("renders on Kubernetes %s", below)
			}
			msg := err.Error()
			want := tc.feature + " "
			if !strings.Contains(msg, "Kubernetes "+below+": ") || !strings.Contains(msg, want) ||
				!strings.Contains(msg, "needs Kubernetes "+tc.min+" or later") || strings.Contains(msg, "\n") {
				t.Errorf("on Kubernetes %s: %q, want one line naming the version, %s and %s", below, msg, tc.feature, tc.min)
			}
		})
	}
	// Each feature that is short says so, in the one line.
	_, err := renderFor(t, c, withUserImage(draValues(nodeCondition)), at("v1.31.0"))
	if err == nil || !strings.Contains(err.Error(), "kubeletAPI dra") || !strings.Contains(err.Error(), "nodeCondition.restrictToOwnNode") {
		t.Errorf("DRA mode and nodeCondition on 1.31: %v, want both named", err)
	}
}
