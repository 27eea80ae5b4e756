package deploy

import (
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
)

// An opt-out that widens what a stolen plugin token may do renders only
// with its exact acknowledgement; without it the chart stops with one line
// that names the key and the fix. With it, NOTES.txt says what was widened.
func TestHelmOptOutsNeedAcknowledgement(t *testing.T) {
	for _, tc := range []struct {
		name, key, ack, phrase string
		vals                   func(ack any) chartutil.Values
	}{
		{"nodeCondition.restrictToOwnNode", "nodeCondition.restrictToOwnNode", "nodeCondition.restrictToOwnNodeAcknowledged",
			"a stolen token can patch every Node's status",
			func(ack any) chartutil.Values {
				nc := map[string]any{"enabled": true, "restrictToOwnNode": false}
				if ack != nil {
					nc["restrictToOwnNodeAcknowledged"] = ack
				}
				return chartutil.Values{"nodeCondition": nc}
			}},
		{"dra.restrictSlicesToNode", "dra.restrictSlicesToNode", "dra.restrictSlicesToNodeAcknowledged",
			"a stolen token can write every node's ResourceSlices and claim status",
			func(ack any) chartutil.Values {
				d := map[string]any{"restrictSlicesToNode": false}
				if ack != nil {
					d["restrictSlicesToNodeAcknowledged"] = ack
				}
				return draValues(chartutil.Values{"dra": d})
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, bad := range []any{nil, "", "yes", true, strings.ToUpper(tc.phrase)} {
				_, err := renderValues(t, loadChart(t), tc.vals(bad))
				if err == nil {
					t.Fatalf("%s: false with acknowledgement %v rendered", tc.key, bad)
				}
				msg := err.Error()
				_, line, _ := strings.Cut(msg, "): ")
				for _, want := range []string{tc.key + ": false widens", tc.ack, `"` + tc.phrase + `"`} {
					if !strings.Contains(line, want) {
						t.Errorf("acknowledgement %v: message %q lacks %q", bad, line, want)
					}
				}
				if strings.Contains(line, "\n") {
					t.Errorf("acknowledgement %v: message is not one line: %q", bad, line)
				}
			}
			objs, notes := renderNotes(t, tc.vals(tc.phrase))
			if errs := objs.validate(); len(errs) > 0 {
				t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
			}
			if !strings.Contains(notes, "WIDENED ("+tc.key+": false): the plugin's token may ") {
				t.Errorf("NOTES.txt does not say what %s: false widened:\n%s", tc.key, notes)
			}
		})
	}
	// Kept on, or its feature off, nothing is asked and nothing is said.
	for _, vals := range []chartutil.Values{
		{"nodeCondition": map[string]any{"enabled": true}},
		{"nodeCondition": map[string]any{"enabled": false, "restrictToOwnNode": false}},
		draValues(nil),
		{"dra": map[string]any{"restrictSlicesToNode": false}},
	} {
		if _, notes := renderNotes(t, vals); strings.Contains(notes, "WIDENED") {
			t.Errorf("with %v NOTES.txt says:\n%s", vals, notes)
		}
	}
}

// No mode or feature grants access to pods cluster-wide: one node's token
// would read every pod of the cluster. nodeLabels.mode nodefeature reads
// its own Pod (the NodeFeature's owners): pods get, in the release
// namespace alone, and nothing else on pods.
func TestHelmRBACHasNoPodsRule(t *testing.T) {
	for _, vals := range []chartutil.Values{
		withHealth(chartutil.Values{}, true, true),
		withHealth(draValues(nil), true, true),
		withHealth(nodeLabelsValues(draValues(nil)), true, false),
		withHealth(nodeFeatureValues(draValues(nil)), true, true),
	} {
		objs := renderWith(t, vals)
		for _, cr := range objs.ClusterRoles {
			for _, r := range cr.Rules {
				for _, res := range r.Resources {
					if res == "pods" || strings.HasPrefix(res, "pods/") || res == "*" {
						t.Errorf("with %v ClusterRole %s grants %v on %s", vals, cr.Name, r.Verbs, res)
					}
				}
			}
		}
		for _, role := range objs.Roles {
			for _, r := range role.Rules {
				for _, res := range r.Resources {
					if (res == "pods" && !slices.Equal(r.Verbs, []string{"get"})) || strings.HasPrefix(res, "pods/") || res == "*" || role.Namespace != releaseNamespace {
						t.Errorf("with %v Role %s/%s grants %v on %s", vals, role.Namespace, role.Name, r.Verbs, res)
					}
				}
			}
		}
	}
}
