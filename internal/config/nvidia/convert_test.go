package nvidia

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestConvert: NVIDIA files as people write them become our config, which
// our loader takes; each setting left behind gets one note naming it.
func TestConvert(t *testing.T) {
	for _, tc := range []struct {
		name  string
		file  string
		env   map[string]string
		want  string   // our config, as YAML
		notes []string // one substring per note, in order
	}{
		{
			name: "time-slicing with renameByDefault",
			file: `version: v1
flags:
  migStrategy: none
  failOnInitError: true
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
      devices: all
`,
			want: `deviceIDStrategy: uuid
deviceListStrategy:
- envvar
migStrategy: none
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
`,
			notes: []string{"flags.failOnInitError: not carried over, no counterpart here: we never exit", "flags.plugin.passDeviceSpecs: not carried over, no counterpart here: device nodes"},
		},
		{
			name: "time-slicing with rename and devices by UUID",
			file: `version: v1
flags:
  migStrategy: mixed
  plugin:
    sharedDevicesAllocationPolicy: packed
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      rename: nvidia.com/h100.shared
      replicas: 8
      devices: ["GPU-5c1d7c3e-2a4b-4f6e-9d0a-1b2c3d4e5f60"]
    - name: nvidia.com/mig-1g.10gb
      replicas: 7
`,
			want: `migStrategy: mixed
sharing:
  timeSlicing:
    placement: packed
    resources:
    - devices:
      - GPU-5c1d7c3e-2a4b-4f6e-9d0a-1b2c3d4e5f60
      name: nvidia.com/gpu
      rename: nvidia.com/h100.shared
      replicas: 8
    - name: nvidia.com/mig-1g.10gb
      replicas: 7
`,
		},
		{
			name: "devices by index or count",
			file: `version: v1
flags: {migStrategy: mixed}
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/gpu, replicas: 2, devices: [0, "1"]}
    - {name: nvidia.com/mig-1g.10gb, replicas: 2, devices: ["0:1"]}
    - {name: nvidia.com/mig-3g.40gb, replicas: 2, devices: 2}
    - {name: nvidia.com/mig-2g.20gb, replicas: 3}
`,
			want: `migStrategy: mixed
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/mig-2g.20gb
      replicas: 3
`,
			notes: []string{`resources[0].devices[0]: "0" is a device index`, `resources[1].devices[0]: "0:1" is a device index`, "resources[2].devices: a count (2) has no counterpart"},
		},
		{
			name: "resources with rename",
			file: `version: v1
flags: {migStrategy: mixed}
resources:
  gpus:
  - pattern: "*A100*"
    name: a100
  mig:
  - pattern: "1g.10gb"
    name: mig-small
`,
			want:  "migStrategy: mixed\n",
			notes: []string{"resources.gpus: not carried over, no counterpart here: NVIDIA's plugin ignores it too", "resources.mig: not carried over"},
		},
		{
			name: "MIG mixed with the GPU Operator's driver",
			file: `version: v1
flags:
  migStrategy: mixed
  nvidiaDriverRoot: /run/nvidia/driver
  nvidiaDevRoot: /run/nvidia/driver
  plugin:
    containerDriverRoot: /driver-root
    deviceListStrategy: [cdi-cri, volume-mounts]
    nvidiaCTKPath: /usr/bin/nvidia-ctk
`,
			want: `devRoot: /run/nvidia/driver/dev
deviceListStrategy:
- cdi-cri
driverRoot: /driver-root
hostDriverRoot: /run/nvidia/driver
migStrategy: mixed
`,
			notes: []string{"flags.plugin.deviceListStrategy: volume-mounts is not offered", "flags.plugin.nvidiaCTKPath: not carried over: our specs run our own static hook, not `nvidia-ctk`; keep the default `cdiHookPath` (counterpart: cdiHookPath (--cdi-hook-path, GPU_DEVICE_PLUGIN_CDI_HOOK_PATH))"},
		},
		{
			name: "gfd flags",
			file: `version: v1
flags:
  migStrategy: single
  useNodeFeatureAPI: true
  gfd:
    oneshot: false
    noTimestamp: false
    sleepInterval: 60s
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    machineTypeFile: /sys/class/dmi/id/product_name
`,
			want: "migStrategy: single\nnodeLabels: nodefeature\n",
			notes: []string{"flags.gfd.oneshot:", "flags.gfd.noTimestamp:",
				"flags.gfd.sleepInterval:", "flags.gfd.outputFile:", "flags.gfd.machineTypeFile:"},
		},
		{
			name: "gfd writing NFD's feature file",
			file: "version: v1\nflags:\n  useNodeFeatureAPI: false\n",
			want: "nodeLabels: nfd\n",
		},
		{
			name: "gfd's NodeFeature API from its variable",
			env:  map[string]string{"GFD_USE_NODE_FEATURE_API": "true"},
			want: "nodeLabels: nodefeature\n",
		},
		{
			name: "the variable wins over the file",
			file: "version: v1\nflags:\n  useNodeFeatureAPI: true\n",
			env:  map[string]string{"USE_NODE_FEATURE_API": "false"},
			want: "nodeLabels: nfd\n",
		},
		{
			name:  "not a boolean",
			env:   map[string]string{"USE_NODE_FEATURE_API": "yes please"},
			want:  "{}\n",
			notes: []string{`USE_NODE_FEATURE_API: "yes please" is not true or false; left out`},
		},
		{
			name: "mps",
			file: `version: v1
flags:
  mpsRoot: /run/nvidia/mps
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
`,
			want:  "mpsRoot: /run/nvidia/mps\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n",
			notes: []string{},
		},
		{
			name: "mps whose failRequestsGreaterThanOne NVIDIA ignores, as the default here does",
			file: `version: v1
sharing:
  mps:
    renameByDefault: true
    failRequestsGreaterThanOne: false
    resources:
    - name: nvidia.com/gpu
      replicas: 4
      devices: ["GPU-8c1e7d5a-0000-4000-8000-000000000000"]
`,
			want:  "sharing:\n  mps:\n    failRequestsGreaterThanOne: false\n    renameByDefault: true\n    resources:\n    - devices:\n      - GPU-8c1e7d5a-0000-4000-8000-000000000000\n      name: nvidia.com/gpu\n      replicas: 4\n",
			notes: []string{},
		},
		{
			name: "unknown keys",
			file: `version: v2
flags:
  migStrategie: mixed
  plugin:
    deviceIdStrategy: index
sharing:
  timeSlicing:
    renameByDefualt: true
    resources:
    - {name: nvidia.com/gpu, replicas: 2, replica: 3}
extra: 1
`,
			want: `sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 2
`,
			notes: []string{"version: \"v2\" is not v1", "extra: unknown NVIDIA key", "flags.migStrategie: unknown NVIDIA key", "flags.plugin.deviceIdStrategy: unknown NVIDIA key",
				"sharing.timeSlicing.renameByDefualt: unknown NVIDIA key", "sharing.timeSlicing.resources[0].replica: unknown NVIDIA key"},
		},
		{
			name: "variables win over the file",
			file: "version: v1\nflags:\n  migStrategy: none\n  plugin:\n    deviceIDStrategy: uuid\n",
			env: map[string]string{"MIG_STRATEGY": "mixed", "DEVICE_LIST_STRATEGY": "envvar,cdi-annotations", "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
				"KUBELET_SOCKET": "/var/lib/k0s/kubelet/device-plugins/kubelet.sock", "PASS_DEVICE_SPECS": "true", "CONFIG_FILE": "/etc/nvidia/config.yaml", "DEVICE_ID_STRATEGY": ""},
			want: `deviceIDStrategy: uuid
deviceListStrategy:
- envvar
- cdi-annotations
devicePluginDir: /var/lib/k0s/kubelet/device-plugins
driverRoot: /run/nvidia/driver
migStrategy: mixed
`,
			notes: []string{"PASS_DEVICE_SPECS: not carried over, no counterpart here", "CONFIG_FILE: not carried over, no counterpart here: our `--config`"},
		},
		{
			name:  "XIDs disabled and enabled: enabled wins, as in NVIDIA's plugin",
			env:   map[string]string{"DP_DISABLE_HEALTHCHECKS": "109, 68,x,48", "DP_ENABLE_HEALTHCHECKS": "48,79"},
			want:  "xids:\n- 109=ignore\n- 68=ignore\n- 48=fatal\n- 79=fatal\n",
			notes: []string{`DP_DISABLE_HEALTHCHECKS: "x" is not an XID`},
		},
		{
			name:  "every XID check off has no counterpart; every one on empties the ignore list",
			env:   map[string]string{"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "ALL"},
			want:  "xidIgnore: []\n",
			notes: []string{`DP_DISABLE_HEALTHCHECKS: "all" turns every XID check off, which has no counterpart here`},
		},
		{
			name: "imex block: channel 0, required",
			file: "version: v1\nimex:\n  channelIDs: [0]\n  required: true\n",
			want: "imex:\n  channelIDs:\n  - 0\n  required: true\n",
		},
		{
			name: "imex variables, as the chart's env gives them, win over the file",
			file: "version: v1\nimex:\n  channelIDs: []\n",
			env:  map[string]string{"IMEX_CHANNEL_IDS": "0", "IMEX_REQUIRED": "false"},
			want: "imex:\n  channelIDs:\n  - 0\n  required: false\n",
		},
		{
			name:  "imex channels NVIDIA refuses are left out",
			file:  "version: v1\nimex:\n  channelIDs: [1, 2]\n",
			env:   map[string]string{"IMEX_REQUIRED": "maybe"},
			want:  "{}\n",
			notes: []string{"imex.channelIDs: [1 2]: only none or [0] is allowed", `IMEX_REQUIRED: "maybe" is not true or false`},
		},
		{
			name: "variables alone",
			env:  map[string]string{"GFD_MIG_STRATEGY": "single", "MIG_STRATEGY": "mixed", "CONTAINER_DRIVER_ROOT": "/driver-root"},
			want: "driverRoot: /driver-root\nhostDriverRoot: /\nmigStrategy: mixed\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var file []byte
			if tc.file != "" {
				file = []byte(tc.file)
			}
			r, err := Convert(file, envOf(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			got, err := r.ConfigYAML()
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("config:\n%s\nwant:\n%s", got, tc.want)
			}
			if len(r.Notes) != len(tc.notes) {
				t.Errorf("%d notes, want %d:\n%s", len(r.Notes), len(tc.notes), strings.Join(r.Notes, "\n"))
			}
			for i, n := range r.Notes {
				if strings.Contains(n, "\n") {
					t.Errorf("note %d takes more than one line: %q", i, n)
				}
				if i < len(tc.notes) && !strings.Contains(n, tc.notes[i]) {
					t.Errorf("note %d = %q, want it to say %q", i, n, tc.notes[i])
				}
			}
			if err := Check(r.Config); err != nil {
				t.Errorf("our loader refuses the converted config: %v\n%s", err, got)
			}
			checkCamelCase(t, r.Config, "")
			values, _ := r.Values()
			checkCamelCase(t, values, "")
			if _, err := yaml.Marshal(values); err != nil {
				t.Error(err)
			}
		})
	}
}

var lowerCamel = regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)

// checkCamelCase: every key we emit is lowerCamelCase, like our own.
func checkCamelCase(t *testing.T, v any, at string) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		for k, sub := range v {
			if !lowerCamel.MatchString(k) {
				t.Errorf("emitted key %s%s is not lowerCamelCase", at, k)
			}
			checkCamelCase(t, sub, at+k+".")
		}
	case []any:
		for _, sub := range v {
			checkCamelCase(t, sub, at)
		}
	}
}

func TestConvertRefusesOtherFiles(t *testing.T) {
	for name, file := range map[string]string{
		"ours":    "migStrategy: mixed\ndeviceIDStrategy: uuid\n",
		"not map": "- a\n- b\n",
		"syntax":  "flags: [\n",
	} {
		if _, err := Convert([]byte(file), nil); err == nil {
			t.Errorf("%s: converted, want an error", name)
		}
	}
}

// TestValues: the chart sets paths and deviceListStrategy from its own
// values, the host's driver root among them.
func TestValues(t *testing.T) {
	r := Result{Config: map[string]any{"driverRoot": "/driver-root", "hostDriverRoot": "/run/nvidia/driver", "devRoot": "/run/nvidia/driver/dev",
		"deviceListStrategy": []string{"cdi-cri"}, "devicePluginDir": "/var/lib/k0s/kubelet/device-plugins", "migStrategy": "mixed"}}
	values, notes := r.Values()
	got, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	want := `config:
  migStrategy: mixed
deviceListStrategy:
- cdi-cri
devicePluginDir: /var/lib/k0s/kubelet/device-plugins
driverRoot: /run/nvidia/driver
`
	if string(got) != want {
		t.Errorf("values:\n%s\nwant:\n%s", got, want)
	}
	if len(notes) != 1 || !strings.HasPrefix(notes[0], "devRoot: /run/nvidia/driver/dev left out") {
		t.Errorf("notes = %q, want one about devRoot", notes)
	}
}

// TestValuesNodeLabels: the chart takes the labels' delivery as its own
// value nodeLabels.mode (it sets --node-labels, the access and the pod's
// namespace), not as config.
func TestValuesNodeLabels(t *testing.T) {
	r, err := Convert(nil, envOf(map[string]string{"USE_NODE_FEATURE_API": "true", "MIG_STRATEGY": "mixed"}))
	if err != nil {
		t.Fatal(err)
	}
	values, notes := r.Values()
	got, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	want := "config:\n  migStrategy: mixed\nnodeLabels:\n  mode: nodefeature\n"
	if string(got) != want || len(notes) != 0 {
		t.Errorf("values:\n%s\nnotes %q; want:\n%s", got, notes, want)
	}
}

// accepts says whether our config file knows the dotted key path: a value
// of the wrong type is refused too, but not as an unknown key, nor as
// NVIDIA's format (a top-level flags).
func accepts(path string) bool {
	parts := strings.Split(path, ".")
	doc := "null"
	for i := len(parts) - 1; i >= 0; i-- {
		doc = fmt.Sprintf("{%q: %s}", parts[i], doc)
	}
	_, err := config.Parse("probe.yaml", []byte(doc))
	return err == nil || !strings.Contains(err.Error(), "unknown key") && !strings.Contains(err.Error(), "config format")
}

// TestNotCarriedIsRefused: a setting migrate leaves behind is one our config
// refuses, derived here from the config itself rather than from a list: an
// NVIDIA key whose path, or flag, our config takes too (sharing.mps,
// --mps-root) is carried over, or its note says on purpose why not.
func TestNotCarriedIsRefused(t *testing.T) {
	flags := map[string]bool{}
	for _, s := range config.Settings() {
		flags[s.Flag] = true
	}
	if !accepts("sharing.timeSlicing") || accepts("sharing.noSuchKey") || accepts("flags.mpsRoot") {
		t.Fatal("accepts does not tell our keys from others")
	}
	for _, k := range Keys() {
		ours := k.File != "" && accepts(k.File) || k.Flag != "" && flags[k.Flag] || k.Ours != "" && accepts(k.Ours)
		deliberate := strings.HasPrefix(k.Note, "not carried over:")
		switch {
		case ours && !k.Carried() && !deliberate:
			t.Errorf("%s: our config takes it (%q), yet migrate does not carry it over, and its note does not say why: %q", k.ID(), k.Ours, k.Note)
		case !ours && k.Carried():
			t.Errorf("%s is carried over onto %q, which our config refuses", k.ID(), k.Ours)
		}
	}
}

// TestKeys: the table is whole and names only what exists here.
func TestKeys(t *testing.T) {
	var ours []string
	for _, k := range Keys() {
		if k.Ours != "" && accepts(k.Ours) {
			ours = append(ours, k.Ours)
		}
	}
	seenID, seenEnv := map[string]bool{}, map[string]string{}
	for _, k := range Keys() {
		if k.File == "" && k.Flag == "" && len(k.Env) == 0 || k.Note == "" {
			t.Errorf("%+v: want a file key, a flag or a variable, and a note", k)
		}
		if seenID[k.ID()] {
			t.Errorf("%s is in the table twice", k.ID())
		}
		seenID[k.ID()] = true
		if k.Ours != "" && !slices.Contains(ours, k.Ours) {
			t.Errorf("%s maps onto %q, which is no key of ours", k.ID(), k.Ours)
		}
		if k.Carried() && k.Ours == "" {
			t.Errorf("%s is carried over onto no key", k.ID())
		}
		for _, e := range k.Env {
			if other, dup := seenEnv[e]; dup {
				t.Errorf("%s is the variable of %s and %s", e, other, k.ID())
			}
			seenEnv[e] = k.ID()
		}
	}
}

func TestInEnv(t *testing.T) {
	found := InEnv(envOf(map[string]string{"MIG_STRATEGY": "mixed", "GFD_MIG_STRATEGY": "single", "NVIDIA_CTK_PATH": "/usr/bin/nvidia-ctk", "FAIL_ON_INIT_ERROR": "", "PATH": "/bin"}))
	var got []string
	for _, f := range found {
		got = append(got, f.Env+"="+f.Value)
	}
	if want := []string{"MIG_STRATEGY=mixed", "NVIDIA_CTK_PATH=/usr/bin/nvidia-ctk"}; !slices.Equal(got, want) {
		t.Errorf("InEnv = %q, want %q (the first of a key's variables; empty is unset)", got, want)
	}
	d := Describe(found)
	for _, want := range []string{"MIG_STRATEGY → migStrategy (--mig-strategy, GPU_DEVICE_PLUGIN_MIG_STRATEGY)", "NVIDIA_CTK_PATH → cdiHookPath (--cdi-hook-path, GPU_DEVICE_PLUGIN_CDI_HOOK_PATH) (not carried over: our specs run our own static hook"} {
		if !strings.Contains(d, want) {
			t.Errorf("Describe = %q, want it to say %q", d, want)
		}
	}
}
