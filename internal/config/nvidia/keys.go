package nvidia

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// Key is one NVIDIA setting and what it is here.
type Key struct {
	// File is the dotted key in NVIDIA's v1 file ("flags.plugin.deviceIDStrategy");
	// empty for a setting NVIDIA takes only as a flag or variable.
	File string
	// Flag is NVIDIA's flag, without dashes; Env its environment
	// variables, the device plugin's and GPU feature discovery's.
	Flag string
	Env  []string
	// Ours is our key that does the same job; empty when there is none.
	Ours string
	// Note says how the value differs here, or why there is no
	// counterpart and what to do instead.
	Note string
	// move carries a value over into our config; nil when it cannot be,
	// and Note is then reported instead.
	move mover
}

// mover puts NVIDIA's value v, given at `at` (a file key or a variable),
// into r, adding a note for any part it leaves out.
type mover func(r *Result, at string, v json.RawMessage)

// ID names the key in messages: its file key, else its flag, else its
// variable (NVIDIA reads some settings from a variable alone).
func (k Key) ID() string {
	switch {
	case k.File != "":
		return k.File
	case k.Flag == "" && len(k.Env) > 0:
		return k.Env[0]
	}
	return "--" + k.Flag
}

// Carried says whether migrate carries the value over.
func (k Key) Carried() bool { return k.move != nil }

// Keys is every NVIDIA setting we know, in the order the guide lists them.
// It covers k8s-device-plugin's api/config/v1 and the flags of its
// nvidia-device-plugin and gpu-feature-discovery commands.
func Keys() []Key {
	return []Key{
		{File: "flags.migStrategy", Flag: "mig-strategy", Env: []string{"MIG_STRATEGY", "GFD_MIG_STRATEGY"}, Ours: "migStrategy",
			Note: "same values: `none`, `single`, `mixed`", move: copyTo("migStrategy")},
		{File: "flags.failOnInitError", Flag: "fail-on-init-error", Env: []string{"FAIL_ON_INIT_ERROR", "GFD_FAIL_ON_INIT_ERROR"},
			Note: "we never exit for a missing driver: the plugin serves nothing, says why once, and retries every `nvmlRetryInterval`"},
		{File: "flags.nvidiaDriverRoot", Flag: "driver-root", Env: []string{"NVIDIA_DRIVER_ROOT"}, Ours: "driverRoot",
			Note: "where the driver is installed, as the plugin sees it; with `flags.plugin.containerDriverRoot`, it becomes `hostDriverRoot`", move: copyTo("driverRoot")},
		{File: "flags.plugin.containerDriverRoot", Flag: "driver-root-ctr-path", Env: []string{"DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"}, Ours: "driverRoot",
			Note: "becomes `driverRoot`, and `flags.nvidiaDriverRoot` becomes `hostDriverRoot`: the driver root as the container runtime sees it, for CDI specs", move: containerDriverRoot},
		{File: "flags.nvidiaDevRoot", Flag: "dev-root", Env: []string{"NVIDIA_DEV_ROOT"}, Ours: "devRoot",
			Note: "`devRoot` is the `/dev` directory itself: NVIDIA's root with `/dev` added", move: devRoot},
		{File: "flags.mpsRoot", Flag: "mps-root", Env: []string{"MPS_ROOT"}, Ours: "mpsRoot",
			Note: "the host folder the MPS daemons keep their pipes, logs and shared memory in, one folder per GPU", move: copyTo("mpsRoot")},
		{File: "flags.gdrcopyEnabled", Flag: "gdrcopy-enabled", Env: []string{"GDRCOPY_ENABLED"},
			Note: "GDRCopy's device node is not added to GPU containers"},
		{File: "flags.gdsEnabled", Flag: "gds-enabled", Env: []string{"GDS_ENABLED"},
			Note: "GPUDirect Storage's device nodes are not added to GPU containers"},
		{File: "flags.mofedEnabled", Flag: "mofed-enabled", Env: []string{"MOFED_ENABLED"},
			Note: "RDMA devices are served apart, as NIC pools: see `nicResources`"},
		{File: "flags.useNodeFeatureAPI", Flag: "use-node-feature-api", Env: []string{"USE_NODE_FEATURE_API", "GFD_USE_NODE_FEATURE_API"}, Ours: "nodeLabels",
			Note: "`true` becomes `nodefeature` (an NFD NodeFeature object, named and labelled as GFD's; needs `podNamespace`, which the chart sets), `false` becomes `nfd` (NFD's local feature file); `-o values` sets the chart's `nodeLabels.mode`", move: nodeFeatureAPI},
		{File: "flags.deviceDiscoveryStrategy", Flag: "device-discovery-strategy", Env: []string{"DEVICE_DISCOVERY_STRATEGY"},
			Note: "GPUs are found through NVML only; Tegra (Jetson) boards are not served"},
		{File: "flags.plugin.passDeviceSpecs", Flag: "pass-device-specs", Env: []string{"PASS_DEVICE_SPECS"},
			Note: "device nodes are always passed with `envvar`; CDI strategies pass them through the spec"},
		{File: "flags.plugin.deviceListStrategy", Flag: "device-list-strategy", Env: []string{"DEVICE_LIST_STRATEGY"}, Ours: "deviceListStrategy",
			Note: "`envvar`, `cdi-cri`, `cdi-annotations`; `volume-mounts` is not offered", move: deviceListStrategy},
		{File: "flags.plugin.deviceIDStrategy", Flag: "device-id-strategy", Env: []string{"DEVICE_ID_STRATEGY"}, Ours: "deviceIDStrategy",
			Note: "same values: `uuid`, `index`", move: copyTo("deviceIDStrategy")},
		{File: "flags.plugin.cdiAnnotationPrefix", Flag: "cdi-annotation-prefix", Env: []string{"CDI_ANNOTATION_PREFIX"},
			Note: "fixed to the CDI library's default"},
		{File: "flags.plugin.nvidiaCTKPath", Flag: "nvidia-cdi-hook-path", Env: []string{"NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"}, Ours: "cdiHookPath",
			Note: "not carried over: our specs run our own static hook, not `nvidia-ctk`; keep the default `cdiHookPath`"},
		{File: "flags.plugin.sharedDevicesAllocationPolicy", Flag: "shared-devices-allocation-policy", Env: []string{"SHARED_DEVICES_ALLOCATION_POLICY"}, Ours: "sharing.timeSlicing.placement",
			Note: "same values: `distributed`, `packed`; applies to time-sliced replicas", move: placement},
		{File: "flags.gfd.oneshot", Flag: "oneshot", Env: []string{"GFD_ONESHOT"}, Note: "labels are written by the serving plugin and kept while it runs; there is no one-shot run"},
		{File: "flags.gfd.noTimestamp", Flag: "no-timestamp", Env: []string{"GFD_NO_TIMESTAMP"}, Note: "no timestamp label is written, ever: nothing changes at rest"},
		{File: "flags.gfd.sleepInterval", Flag: "sleep-interval", Env: []string{"GFD_SLEEP_INTERVAL"}, Note: "labels are computed at start and the file is rewritten only when they change or before NFD's one-hour expiry"},
		{File: "flags.gfd.outputFile", Flag: "output-file", Env: []string{"GFD_OUTPUT_FILE"}, Ours: "nfdFeaturesDir", Note: "not carried over: the folder is set, not the file: ours is gpu-device-plugin in it"},
		{File: "flags.gfd.machineTypeFile", Flag: "machine-type-file", Env: []string{"GFD_MACHINE_TYPE_FILE"}, Note: "gpu.machine is read from DMI under sysfsRoot (class/dmi/id/product_name)"},
		{File: "resources.gpus",
			Note: "NVIDIA's plugin ignores it too; pods keep asking for `nvidia.com/gpu`, or time-slicing's `rename` serves replicas under another name"},
		{File: "resources.mig",
			Note: "NVIDIA's plugin ignores it too; MIG devices are served as `nvidia.com/mig-<profile>` under `migStrategy: mixed`"},
		{File: "sharing.timeSlicing", Ours: "sharing.timeSlicing",
			Note: "same shape: `renameByDefault`, `failRequestsGreaterThanOne`, `resources[{name, replicas, rename, devices}]`; devices by UUID or model name, not by index or count", move: timeSlicing},
		{File: "sharing.mps", Ours: "sharing.mps",
			Note: "same shape as `sharing.timeSlicing`; one share per container, as NVIDIA's plugin serves it, is the default here too, held by the daemon (`maxSharesPerContainer` allows more); at most 48 replicas a GPU; device-plugin mode only (DRA shares through claims)", move: mps},
		{File: "imex.channelIDs", Flag: "imex-channel-ids", Env: []string{"IMEX_CHANNEL_IDS"}, Ours: "imex.channelIDs",
			Note: "same values: none or `[0]`; the channel's node is made when missing (NVIDIA's plugin only looks for it); device-plugin mode only (DRA gives channels through ComputeDomains)", move: imexChannelIDs},
		{File: "imex.required", Flag: "imex-required", Env: []string{"IMEX_REQUIRED"}, Ours: "imex.required",
			Note: "same meaning: a channel that cannot be made or found stops the plugin at start", move: imexRequired},
		{Env: []string{"DP_DISABLE_HEALTHCHECKS"}, Ours: "xids",
			Note: "each XID listed becomes an `xids` entry `XID=ignore`; `all` or `xids` (every XID check off) has no counterpart: list the XIDs. NVIDIA's plugin always ignores 13, 31, 43, 45, 68 and 109; here the defaults come from NVIDIA's XID catalog, which makes 109 fatal: add `109=ignore` to keep it ignored", move: healthCheckXIDs("ignore")},
		{Env: []string{"DP_ENABLE_HEALTHCHECKS"}, Ours: "xids",
			Note: "each XID listed becomes an `xids` entry `XID=fatal` (NVIDIA's plugin keeps the GPU unhealthy until it restarts), winning over `DP_DISABLE_HEALTHCHECKS` as there; `all` becomes `xidIgnore: []`", move: healthCheckXIDs("fatal")},
		{Flag: "kubelet-socket", Env: []string{"KUBELET_SOCKET"}, Ours: "devicePluginDir",
			Note: "the directory the kubelet's socket is in", move: socketDir},
		{Flag: "config-file", Env: []string{"CONFIG_FILE", "GFD_CONFIG_FILE"},
			Note: "our `--config` (`" + config.EnvName("config") + "`) takes our own format: convert NVIDIA's file with `gpu-device-plugin migrate --from FILE`"},
		{Flag: "cdi-feature-flags", Env: []string{"CDI_FEATURE_FLAGS"},
			Note: "our CDI specs are built here, not by `nvidia-ctk`"},
		{Flag: "cdi-disable-hooks", Env: []string{"CDI_DISABLE_HOOKS"}, Ours: "cdiHookPath",
			Note: "not carried over: an empty `cdiHookPath` leaves our one hook out of the specs"},
	}
}

// Counterpart says what k is here, for people: our key with its flag and
// variable, or "none".
func (k Key) Counterpart() string {
	if k.Ours == "" {
		return "none"
	}
	for _, s := range config.Settings() {
		if s.Key == k.Ours {
			return fmt.Sprintf("%s (--%s, %s)", s.Key, s.Flag, s.Env)
		}
	}
	return k.Ours + " (config file only)"
}

// Table is the migration guide's table of keys, in Markdown.
func Table() string {
	var b strings.Builder
	b.WriteString("| NVIDIA (`version: v1` file) | flag / environment | gpu-device-plugin key | notes |\n|---|---|---|---|\n")
	for _, k := range Keys() {
		file := "flag only"
		switch {
		case k.File != "":
			file = "`" + k.File + "`"
		case k.Flag == "":
			file = "variable only"
		}
		flag := "`--" + k.Flag + "`"
		if k.Flag == "" {
			flag = ""
		}
		if len(k.Env) > 0 {
			flag += " / `" + strings.Join(k.Env, "`, `") + "`"
		}
		ours := "none"
		if k.Ours != "" {
			ours = "`" + k.Ours + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", file, strings.TrimPrefix(flag, " / "), ours, strings.ReplaceAll(k.Note, "|", `\|`))
	}
	return b.String()
}

// copyTo carries a value over unchanged.
func copyTo(ours string) mover {
	return func(r *Result, at string, v json.RawMessage) {
		var s any
		if err := json.Unmarshal(v, &s); err != nil {
			r.note(at, fmt.Sprintf("not valid JSON (%v); set %s by hand", err, ours))
			return
		}
		r.Config[ours] = s
	}
}

func str(r *Result, at string, v json.RawMessage) (string, bool) {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		r.note(at, fmt.Sprintf("want a string, got %s; left out", v))
		return "", false
	}
	return s, true
}

// containerDriverRoot: NVIDIA's plugin sees the host's driver root
// (nvidiaDriverRoot, default /) at this path, which is our driverRoot;
// the host's path becomes hostDriverRoot, which CDI specs use.
func containerDriverRoot(r *Result, at string, v json.RawMessage) {
	s, ok := str(r, at, v)
	if !ok {
		return
	}
	host := "/"
	if h, ok := r.Config["driverRoot"].(string); ok {
		host = h
	}
	if host != s {
		r.Config["hostDriverRoot"] = host
	}
	r.Config["driverRoot"] = s
}

func devRoot(r *Result, at string, v json.RawMessage) {
	if s, ok := str(r, at, v); ok && s != "" {
		r.Config["devRoot"] = path.Join(s, "dev")
	}
}

func socketDir(r *Result, at string, v json.RawMessage) {
	if s, ok := str(r, at, v); ok && s != "" {
		r.Config["devicePluginDir"] = path.Dir(s)
	}
}

// deviceListStrategy takes a string, a comma-separated string (as the
// variable gives it) or a list.
func deviceListStrategy(r *Result, at string, v json.RawMessage) {
	var list []string
	if err := json.Unmarshal(v, &list); err != nil {
		s, ok := str(r, at, v)
		if !ok {
			return
		}
		list = strings.Split(s, ",")
	}
	var out []string
	for _, s := range list {
		switch s = strings.TrimSpace(s); s {
		case "":
		case "volume-mounts":
			r.note(at, "volume-mounts is not offered; left out (use envvar or cdi-cri)")
		default:
			out = append(out, s)
		}
	}
	if len(out) > 0 {
		r.Config["deviceListStrategy"] = out
	}
}

// nodeFeatureAPI: GFD writes an NFD NodeFeature object with it on, NFD's
// feature file with it off. A variable gives the boolean as text.
func nodeFeatureAPI(r *Result, at string, v json.RawMessage) {
	var on bool
	if err := json.Unmarshal(v, &on); err != nil {
		s, ok := str(r, at, v)
		if !ok {
			return
		}
		if on, err = strconv.ParseBool(strings.TrimSpace(s)); err != nil {
			r.note(at, fmt.Sprintf("%q is not true or false; left out (nodeLabels stays nfd, NFD's feature file)", s))
			return
		}
	}
	r.Config["nodeLabels"] = map[bool]string{true: config.NodeLabelsNodeFeature, false: config.NodeLabelsNFD}[on]
}

func placement(r *Result, at string, v json.RawMessage) {
	if s, ok := str(r, at, v); ok {
		r.sharingSection("timeSlicing")["placement"] = s
	}
}

// healthCheckXIDs carries NVIDIA's comma-separated XID list over as xids
// entries of class; an entry for the same XID from an earlier variable is
// replaced, as DP_ENABLE_HEALTHCHECKS wins over DP_DISABLE_HEALTHCHECKS.
func healthCheckXIDs(class string) mover {
	return func(r *Result, at string, v json.RawMessage) {
		s, ok := str(r, at, v)
		if !ok {
			return
		}
		entries, _ := r.Config["xids"].([]any)
		for _, f := range strings.Split(strings.ToLower(s), ",") {
			switch f = strings.TrimSpace(f); {
			case f == "":
			case (f == "all" || f == "xids") && class == "fatal":
				r.Config["xidIgnore"] = []any{}
			case f == "all" || f == "xids":
				r.note(at, fmt.Sprintf("%q turns every XID check off, which has no counterpart here; left out: list the XIDs to ignore", f))
			default:
				x, err := strconv.ParseUint(f, 10, 32)
				if err != nil {
					r.note(at, fmt.Sprintf("%q is not an XID; left out, as NVIDIA's plugin leaves it out", f))
					continue
				}
				entries = slices.DeleteFunc(entries, func(e any) bool { return strings.HasPrefix(e.(string), f+"=") })
				entries = append(entries, fmt.Sprintf("%d=%s", x, class))
			}
		}
		if len(entries) > 0 {
			r.Config["xids"] = entries
		}
	}
}

// imexSection is our imex map, made on first use.
func (r *Result) imexSection() map[string]any {
	sec, _ := r.Config["imex"].(map[string]any)
	if sec == nil {
		sec = map[string]any{}
		r.Config["imex"] = sec
	}
	return sec
}

// imexChannelIDs takes a list of numbers, or a comma-separated string as
// IMEX_CHANNEL_IDS gives it. NVIDIA's plugin refuses anything but none or
// [0] at start; so does ours, so such a value is left out with a note.
func imexChannelIDs(r *Result, at string, v json.RawMessage) {
	var ids []int
	if err := json.Unmarshal(v, &ids); err != nil {
		s, ok := str(r, at, v)
		if !ok {
			return
		}
		for _, f := range strings.Split(s, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			n, err := strconv.Atoi(f)
			if err != nil {
				r.note(at, fmt.Sprintf("%q is not a list of channel numbers; left out", s))
				return
			}
			ids = append(ids, n)
		}
	}
	if len(ids) > 1 || len(ids) == 1 && ids[0] != 0 {
		r.note(at, fmt.Sprintf("%v: only none or [0] is allowed (NVIDIA's plugin refuses it too); left out", ids))
		return
	}
	r.imexSection()["channelIDs"] = ids
}

// imexRequired takes a boolean, or its string form as IMEX_REQUIRED
// gives it.
func imexRequired(r *Result, at string, v json.RawMessage) {
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		s, ok := str(r, at, v)
		if !ok {
			return
		}
		if b, err = strconv.ParseBool(strings.TrimSpace(s)); err != nil {
			r.note(at, fmt.Sprintf("%q is not true or false; left out", s))
			return
		}
	}
	r.imexSection()["required"] = b
}
