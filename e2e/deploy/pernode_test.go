package deploy

import (
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const (
	nvidiaConfigLabel = "nvidia.com/device-plugin.config" // NVIDIA's chart's, the default
	configPodLabel    = "gpu-device-plugin.github.io/config"
)

// twoConfigs is config.map with two named settings: one a map, one YAML
// text (as --set-file gives), with the user's own required node affinity.
func twoConfigs(t *testing.T, extra map[string]any) chartutil.Values {
	t.Helper()
	nics := nicPoolValues(t)["config"].(map[string]any)["nicResources"]
	cfg := map[string]any{
		"logLevel": "debug",
		"map": map[string]any{
			"h100-nics": map[string]any{"deviceIDStrategy": "index", "nicResources": nics},
			"a100":      "deviceIDStrategy: uuid\nhealthPollInterval: 7s\n",
		},
	}
	for k, v := range extra {
		cfg[k] = v
	}
	return chartutil.Values{
		"config": cfg,
		// Two required terms: the config label must be ANDed into each.
		"affinity": map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
			"nodeSelectorTerms": []any{
				map[string]any{"matchExpressions": []any{map[string]any{"key": "example.com/pool", "operator": "In", "values": []any{"gpu"}}}},
				map[string]any{"matchFields": []any{map[string]any{"key": "metadata.name", "operator": "In", "values": []any{"gpu-7"}}}},
			},
		}}},
	}
}

// wantVariant is one DaemonSet of a per-node render.
type wantVariant struct {
	name      string   // DaemonSet
	selects   string   // its config label value; "" for the default DaemonSet, which has none
	operator  string   // In or NotIn on the node label
	values    []string // of the node label
	configKey string   // the ConfigMap key mounted as config.yaml
	settings  map[string]any
	hostNet   bool // NIC pools
}

// Two named configs give three DaemonSets: one per name on the nodes
// labelled with it, and the chart's own on every other node; each mounts
// its own settings as config.yaml and passes the API server's validation
// and the plugin's.
func TestHelmPerNodeConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra map[string]any
		want  []wantVariant
	}{
		{
			name: "config's own settings elsewhere",
			want: []wantVariant{
				{name: "gpu-device-plugin", operator: "NotIn", values: []string{"a100", "h100-nics"}, configKey: "config.yaml",
					settings: map[string]any{"logLevel": "debug", "deviceIDStrategy": "uuid"}},
				{name: "gpu-device-plugin-a100", selects: "a100", operator: "In", values: []string{"a100"}, configKey: "config.a100.yaml",
					settings: map[string]any{"healthPollInterval": "7s"}},
				{name: "gpu-device-plugin-h100-nics", selects: "h100-nics", operator: "In", values: []string{"h100-nics"}, configKey: "config.h100-nics.yaml",
					settings: map[string]any{"deviceIDStrategy": "index"}, hostNet: true},
			},
		},
		{
			// Nodes labelled a100 run the default DaemonSet, with a100's
			// settings: no DaemonSet of its own.
			name:  "config.default names one, another label key",
			extra: map[string]any{"default": "a100", "nodeLabel": "example.com/gpu-config"},
			want: []wantVariant{
				{name: "gpu-device-plugin", operator: "NotIn", values: []string{"h100-nics"}, configKey: "config.yaml",
					settings: map[string]any{"healthPollInterval": "7s"}},
				{name: "gpu-device-plugin-h100-nics", selects: "h100-nics", operator: "In", values: []string{"h100-nics"}, configKey: "config.h100-nics.yaml",
					settings: map[string]any{"deviceIDStrategy": "index"}, hostNet: true},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := twoConfigs(t, tc.extra)
			objs := renderWith(t, vals)
			if errs := objs.validate(); len(errs) > 0 {
				t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
			}
			if len(objs.ConfigMaps) != 1 || len(objs.DaemonSets) != len(tc.want) {
				t.Fatalf("want one ConfigMap and %d DaemonSets, got %d and %d", len(tc.want), len(objs.ConfigMaps), len(objs.DaemonSets))
			}
			labelKey := nvidiaConfigLabel
			if k, ok := tc.extra["nodeLabel"].(string); ok {
				labelKey = k
			}
			cm := objs.ConfigMaps[0]
			if len(cm.Data) != len(tc.want) {
				t.Errorf("ConfigMap keys %v, want one per DaemonSet", keysOf(cm.Data))
			}
			for i, want := range tc.want {
				ds := objs.DaemonSets[i]
				t.Run(want.name, func(t *testing.T) {
					if ds.Name != want.name {
						t.Fatalf("DaemonSet %d is %s, want %s", i, ds.Name, want.name)
					}
					checkVariantSelector(t, ds, want.selects)
					checkVariantAffinity(t, ds, labelKey, want.operator, want.values)

					mounted := mountedConfig(t, ds, cm)
					if key := configItemKey(t, ds); key != want.configKey {
						t.Errorf("mounts ConfigMap key %q as config.yaml, want %q", key, want.configKey)
					}
					var got map[string]any
					if err := yaml.Unmarshal([]byte(mounted.Data["config.yaml"]), &got); err != nil {
						t.Fatal(err)
					}
					for k, v := range want.settings {
						if got[k] != v {
							t.Errorf("config.yaml %s = %v, want %v (all: %v)", k, got[k], v, got)
						}
					}
					for _, k := range []string{"map", "default", "nodeLabel"} {
						if _, ok := got[k]; ok {
							t.Errorf("config.yaml has the chart's key %s: %v", k, got)
						}
					}
					if _, ok := got["deviceListStrategy"]; !ok {
						t.Error("config.yaml lacks the chart's deviceListStrategy")
					}
					if _, ok := got["nicResources"]; ok != want.hostNet {
						t.Errorf("nicResources in config.yaml: %v, want %v", ok, want.hostNet)
					}
					spec := ds.Spec.Template.Spec
					if spec.HostNetwork != want.hostNet || hasVolume(spec.Volumes, "devinfo") != want.hostNet {
						t.Errorf("hostNetwork %v, devinfo volume %v; want both %v (NIC pools in this DaemonSet's settings)",
							spec.HostNetwork, hasVolume(spec.Volumes, "devinfo"), want.hostNet)
					}
					if ds.Spec.Template.Annotations["checksum/config"] == "" {
						t.Error("no checksum/config: a change of its settings would not roll its pods")
					}
					checkDaemonSet(t, ds, mounted, wantDaemonSet{
						namespace: releaseNamespace, hostDriverRoot: "/", devicePluginDir: "/var/lib/kubelet/device-plugins", cdiSpecDir: "/var/run/cdi",
						cdiHookDir: defaultCDIHookDir, stateDir: "/var/lib/gpu-device-plugin/state", podResourcesDir: defaultPodResourcesDir,
						privileged: true, image: defaultImage, maxUnavailable: intstr.FromInt32(1), ownAffinity: true,
					})
					checkAcceptedByPlugin(t, ds, mounted)
				})
			}
			// Each DaemonSet's settings roll only its own pods.
			sums := map[string]bool{}
			for _, ds := range objs.DaemonSets {
				sums[ds.Spec.Template.Annotations["checksum/config"]] = true
			}
			if len(sums) != len(objs.DaemonSets) {
				t.Errorf("DaemonSets share a checksum/config: %v", sums)
			}
		})
	}
}

// DRA mode makes a DeviceClass for every NIC pool of any DaemonSet's
// settings, not only config's own.
func TestHelmPerNodeConfigDRADeviceClasses(t *testing.T) {
	objs := renderWith(t, draValues(twoConfigs(t, nil)))
	if errs := objs.validate(); len(errs) > 0 {
		t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
	}
	var names []string
	for _, dc := range objs.DeviceClasses {
		names = append(names, dc.Name)
	}
	for _, want := range []string{"example.com-rdma-numa0.gpu-device-plugin.github.io", "example.com-rdma-numa1.gpu-device-plugin.github.io"} {
		if !slices.Contains(names, want) {
			t.Errorf("DeviceClasses %v lack %s (a pool of config.map.h100-nics)", names, want)
		}
	}
	if len(objs.DaemonSets) != 3 {
		t.Errorf("%d DaemonSets in DRA mode, want 3", len(objs.DaemonSets))
	}
}

// Without config.map the chart renders what it rendered before config.map
// existed (values without its keys at all: null deletes a default), byte
// for byte, whatever config.nodeLabel says; and the one
// DaemonSet has no config label, no affinity of ours and no items.
func TestHelmWithoutConfigMapUnchanged(t *testing.T) {
	c := loadChart(t)
	bases := map[string]chartutil.Values{
		"defaults":        {},
		"values-all.yaml": readValues(t, "testdata/values-all.yaml"),
		"kubeletAPI=dra":  draValues(nicPoolValues(t)),
	}
	for name, base := range bases {
		t.Run(name, func(t *testing.T) {
			with := func(cfg map[string]any) chartutil.Values {
				out := chartutil.Values{}
				for k, v := range base {
					out[k] = v
				}
				merged := map[string]any{}
				if bc, ok := base["config"].(map[string]any); ok {
					for k, v := range bc {
						merged[k] = v
					}
				}
				for k, v := range cfg {
					merged[k] = v
				}
				out["config"] = merged
				return out
			}
			before, err := renderValues(t, c, with(map[string]any{"map": nil, "default": nil, "nodeLabel": nil}))
			if err != nil {
				t.Fatal(err)
			}
			for _, cfg := range []map[string]any{
				{},
				{"map": map[string]any{}, "nodeLabel": "example.com/other"},
			} {
				now, err := renderValues(t, c, with(cfg))
				if err != nil {
					t.Fatal(err)
				}
				for file, text := range before {
					if now[file] != text {
						t.Errorf("with config %v, %s differs from the render without config.map's keys:\n%s\nbefore:\n%s", cfg, file, now[file], text)
					}
				}
			}
			objs := renderWith(t, base)
			if len(objs.DaemonSets) != 1 {
				t.Fatalf("%d DaemonSets, want 1", len(objs.DaemonSets))
			}
			ds := objs.DaemonSets[0]
			checkVariantSelector(t, ds, "")
			if a := ds.Spec.Template.Spec.Affinity; a != nil && strings.Contains(toYAML(t, a), nvidiaConfigLabel) {
				t.Errorf("affinity names the config label without config.map: %s", toYAML(t, a))
			}
			if key := configItemKey(t, ds); key != "" {
				t.Errorf("the config volume maps key %q without config.map", key)
			}
			if keys := keysOf(objs.ConfigMaps[0].Data); !slices.Equal(keys, []string{"config.yaml"}) {
				t.Errorf("ConfigMap keys %v, want config.yaml only", keys)
			}
		})
	}
}

func TestHelmPerNodeConfigRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  map[string]any
		want string
	}{
		{"name not a label value", map[string]any{"map": map[string]any{"H100_big": map[string]any{}}}, `config.map: name "H100_big"`},
		{"name too long", map[string]any{"map": map[string]any{strings.Repeat("a", 50): map[string]any{}}}, "longer than 63 characters"},
		{"default not in map", map[string]any{"map": map[string]any{"a100": map[string]any{}}, "default": "h100"}, `config.default "h100": not a name in config.map (a100)`},
		{"default without map", map[string]any{"default": "h100"}, `config.default "h100"`},
		{"text not YAML", map[string]any{"map": map[string]any{"a100": "deviceIDStrategy: [uuid\n"}}, "config.map.a100: not YAML"},
		{"a list", map[string]any{"map": map[string]any{"a100": []any{"uuid"}}}, "config.map.a100: want the plugin's settings"},
		{"chart key in a named config", map[string]any{"map": map[string]any{"a100": map[string]any{"nodeLabel": "x"}}}, "config.map.a100.nodeLabel"},
		{"bad label key", map[string]any{"map": map[string]any{"a100": map[string]any{}}, "nodeLabel": "not a label"}, `config.nodeLabel "not a label"`},
		{"kubeletAPI in a named config", map[string]any{"map": map[string]any{"a100": map[string]any{"kubeletAPI": "dra"}}}, "config.kubeletAPI"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderValues(t, loadChart(t), chartutil.Values{"config": tc.cfg})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestHelmLintPerNodeConfig(t *testing.T) {
	for name, vals := range map[string]chartutil.Values{
		"two configs":             twoConfigs(t, nil),
		"two configs, default":    twoConfigs(t, map[string]any{"default": "a100"}),
		"two configs, DRA mode":   draValues(twoConfigs(t, nil)),
		"only the default's name": {"config": map[string]any{"map": map[string]any{"a100": map[string]any{}}, "default": "a100"}},
	} {
		t.Run(name, func(t *testing.T) {
			objs := renderWith(t, vals)
			if errs := objs.validate(); len(errs) > 0 {
				t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
			}
			checkLint(t, vals)
		})
	}
}

// checkVariantSelector checks that a config.map DaemonSet selects its own
// pods by the config label, and that the default one keeps the chart's
// usual selector (adding config.map must not change it: it is immutable).
func checkVariantSelector(t *testing.T, ds *appsv1.DaemonSet, selects string) {
	t.Helper()
	sel := ds.Spec.Selector.MatchLabels
	got, ok := sel[configPodLabel]
	if selects == "" {
		if ok || len(sel) != 2 {
			t.Errorf("selector %v, want the chart's app.kubernetes.io/name and instance only", sel)
		}
		return
	}
	if got != selects || ds.Spec.Template.Labels[configPodLabel] != selects {
		t.Errorf("selector %v, pod labels %v: want %s=%s in both", sel, ds.Spec.Template.Labels, configPodLabel, selects)
	}
}

// checkVariantAffinity checks that every required term of the pod's node
// affinity (the user's two, ANDed with ours) has the config label's
// expression, and keeps the user's own.
func checkVariantAffinity(t *testing.T, ds *appsv1.DaemonSet, key, op string, values []string) {
	t.Helper()
	a := ds.Spec.Template.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatalf("no required node affinity: %v", a)
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 2 || len(terms[0].MatchExpressions) != 2 || terms[0].MatchExpressions[0].Key != "example.com/pool" ||
		len(terms[1].MatchFields) != 1 {
		t.Errorf("the user's terms are not kept, each with ours: %s", toYAML(t, terms))
	}
	for i, term := range terms {
		found := false
		for _, e := range term.MatchExpressions {
			if e.Key == key {
				found = true
				if string(e.Operator) != op || !slices.Equal(e.Values, values) {
					t.Errorf("term %d: %s %s %v, want %s %v", i, key, e.Operator, e.Values, op, values)
				}
			}
		}
		if !found {
			t.Errorf("term %d has no expression on %s: %s", i, key, toYAML(t, term))
		}
	}
}

// configItemKey is the ConfigMap key the config volume projects as
// config.yaml; "" when it projects the whole ConfigMap.
func configItemKey(t *testing.T, ds *appsv1.DaemonSet) string {
	t.Helper()
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name != "config" || v.ConfigMap == nil {
			continue
		}
		if len(v.ConfigMap.Items) == 0 {
			return ""
		}
		if len(v.ConfigMap.Items) != 1 || v.ConfigMap.Items[0].Path != "config.yaml" {
			t.Fatalf("config volume items %v, want one, at config.yaml", v.ConfigMap.Items)
		}
		return v.ConfigMap.Items[0].Key
	}
	t.Fatal("no config volume")
	return ""
}

// mountedConfig is the ConfigMap as the DaemonSet's pods see it in their
// config volume: the projected key as config.yaml.
func mountedConfig(t *testing.T, ds *appsv1.DaemonSet, cm *corev1.ConfigMap) *corev1.ConfigMap {
	t.Helper()
	key := configItemKey(t, ds)
	if key == "" {
		return cm
	}
	data, ok := cm.Data[key]
	if !ok {
		t.Fatalf("the config volume projects key %q, which ConfigMap %s lacks (it has %v)", key, cm.Name, keysOf(cm.Data))
	}
	out := cm.DeepCopy()
	out.Data = map[string]string{"config.yaml": data}
	return out
}

func keysOf(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func toYAML(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
