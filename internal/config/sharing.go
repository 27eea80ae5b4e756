package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
	"sigs.k8s.io/yaml"
)

// MIG strategies, the values of migStrategy. They shape the device-plugin
// API only: DRA mode publishes the MIG devices of MIG GPUs whatever it says.
const (
	// MIGStrategyNone serves no MIG device.
	MIGStrategyNone = "none"
	// MIGStrategySingle serves MIG devices as nvidia.com/gpu, for nodes
	// whose MIG GPUs all carry one profile.
	MIGStrategySingle = "single"
	// MIGStrategyMixed serves each MIG profile as nvidia.com/mig-<profile>
	// and GPUs without MIG as nvidia.com/gpu.
	MIGStrategyMixed = "mixed"
)

func migStrategies() []string { return []string{MIGStrategyNone, MIGStrategySingle, MIGStrategyMixed} }

// Placements, the values of sharing.timeSlicing.placement: how the
// preferred allocation picks replicas.
const (
	// PlacementDistributed spreads a request's replicas over the devices
	// with the fewest replicas handed out.
	PlacementDistributed = "distributed"
	// PlacementPacked fills the devices already in use first.
	PlacementPacked = "packed"
)

func placements() []string { return []string{PlacementDistributed, PlacementPacked} }

// Sharing is how devices are shared between containers, file-only (no
// flag), like nicResources.
type Sharing struct {
	TimeSlicing TimeSlicing `json:"timeSlicing,omitempty"`
	MPS         MPS         `json:"mps,omitempty"`
	// MemoryShares is DRA mode's: see memoryshares.go.
	MemoryShares MemoryShares `json:"memoryShares,omitempty"`
	// MIGPartitions is DRA mode's: see migpartitions.go.
	MIGPartitions MIGPartitions `json:"migPartitions,omitempty"`
}

// TimeSlicing serves each selected device as several replicas, so that
// several containers get the same device and the driver time-slices it
// between them. Nothing isolates their memory or faults. It shapes the
// device-plugin API only: the DRA front-end ignores it.
//
// Example, abridged from internal/config/testdata/example-sharing.yaml:
//
//	migStrategy: mixed
//	sharing:
//	  timeSlicing:
//	    renameByDefault: true
//	    resources:
//	      - name: nvidia.com/gpu          # every other GPU: 4, as nvidia.com/gpu.shared
//	        replicas: 4
//	      - name: nvidia.com/gpu          # H100s: 8, as nvidia.com/h100.shared
//	        replicas: 8
//	        rename: nvidia.com/h100.shared
//	        devices: ["NVIDIA H100 80GB HBM3"]
//	      - name: nvidia.com/mig-1g.10gb  # each 1g.10gb MIG device: 7
//	        replicas: 7
type TimeSlicing struct {
	// RenameByDefault serves replicas under <name>.shared when an entry
	// has no rename, so a pod asking for nvidia.com/gpu never gets a
	// shared device by surprise.
	RenameByDefault bool `json:"renameByDefault,omitempty"`
	// FailRequestsGreaterThanOne refuses a container asking for more than
	// one replica: two replicas of one GPU are no more GPU than one.
	FailRequestsGreaterThanOne bool `json:"failRequestsGreaterThanOne,omitempty"`
	// Placement is PlacementDistributed or PlacementPacked; empty means
	// distributed.
	Placement string           `json:"placement,omitempty"`
	Resources []SharedResource `json:"resources,omitempty"`
}

// SharedResource gives the devices of one served resource replicas.
type SharedResource struct {
	// Name is the resource as served: nvidia.com/gpu, or
	// nvidia.com/mig-<profile> with migStrategy mixed (a profile's "+"
	// becomes "."; example: nvidia.com/mig-1g.10gb).
	Name string `json:"name"`
	// Rename is the resource to serve the replicas under; empty: the name
	// (or <name>.shared with renameByDefault).
	Rename string `json:"rename,omitempty"`
	// Replicas is how many containers may hold each device, 2 or more.
	Replicas int `json:"replicas"`
	// Devices picks the devices: GPU- or MIG- UUIDs, or GPU model names as
	// NVML gives them (example: "NVIDIA H100 80GB HBM3"). Empty: every
	// device of the resource that no other entry names.
	Devices []string `json:"devices,omitempty"`
}

// MaxReplicas bounds replicas: each replica is a device the kubelet
// lists, checkpoints and sends in every ListAndWatch update.
const MaxReplicas = 1024

// MPS serves each selected GPU as several replicas shared through an MPS
// control daemon that the plugin runs per GPU. The daemon holds every
// client to maxSharesPerContainer shares (default 1) of the GPU's threads
// and pinned memory, whatever the client's environment says; a
// container's environment (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) narrows that to the k shares it holds,
// k/replicas, and only narrows. The plugin runs MPS on whole GPUs only
// (the config refuses MIG devices), and for the device-plugin API only.
//
// Example, from internal/config/testdata/example-mps.yaml:
//
//	sharing:
//	  mps:
//	    renameByDefault: true
//	    resources:
//	      - name: nvidia.com/gpu          # H100s: 8 shares each, as nvidia.com/gpu.shared
//	        replicas: 8
//	        devices: ["NVIDIA H100 80GB HBM3"]
type MPS struct {
	// RenameByDefault is as in TimeSlicing.
	RenameByDefault bool `json:"renameByDefault,omitempty"`
	// FailRequestsGreaterThanOne is taken for NVIDIA's format, whose MPS
	// serves one share per container whatever it says. Here one share
	// per container is the default too: true means the default, and may
	// not be set beside a MaxSharesPerContainer above 1.
	FailRequestsGreaterThanOne bool `json:"failRequestsGreaterThanOne,omitempty"`
	// MaxSharesPerContainer is the most shares of a GPU one container may
	// hold, 1 (the default, as 0) to the fewest replicas of an entry.
	// Allocate refuses more. The daemon holds every client to this many
	// shares: with more than 1, a container holding fewer is narrowed to
	// them by its environment only, which it can clear.
	MaxSharesPerContainer int              `json:"maxSharesPerContainer,omitempty"`
	Resources             []SharedResource `json:"resources,omitempty"`
}

// MaxMPSReplicas bounds MPS replicas. MPS counts client processes (CUDA
// contexts), not containers: a server takes at most 48 per GPU on Volta
// and later. A replica runs at least one and may run several, so 48
// replicas is the most a GPU can serve, and only while each runs one.
const MaxMPSReplicas = 48

// Enabled says whether any device is time-sliced.
func (t TimeSlicing) Enabled() bool { return len(t.Resources) > 0 }

// Enabled says whether any GPU is shared through MPS.
func (m MPS) Enabled() bool { return len(m.Resources) > 0 }

// servedName is the resource an entry's replicas are served under, as
// sharing.ServedName decides it; validation checks those names.
func servedName(r SharedResource, renameByDefault bool) string {
	switch {
	case r.Rename != "":
		return r.Rename
	case renameByDefault:
		return r.Name + resname.SharedSuffix
	}
	return r.Name
}

// migResource is a MIG profile as mixed serves it: [<c>c.]<g>g.<mem>gb
// and suffixes such as .me, .gfx, -me, .me.all ("+" written as ".").
var migResource = regexp.MustCompile(`^nvidia\.com/mig-([1-9][0-9]*c\.)?[1-9][0-9]*g\.[0-9]+gb([.-][a-z0-9]+)*$`)

const sharingExample = "internal/config/testdata/example-sharing.yaml"

// checkSharing checks the sharing section's shape: every key known (in
// its exact case, which the JSON decoder underneath would not require),
// every value of the right type, each error naming its key path. Each
// error starts "config: <path>: ".
func checkSharing(path string, data []byte) error {
	var doc struct {
		Sharing json.RawMessage `json:"sharing"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil || isNull(doc.Sharing) {
		return nil // the whole-file decoder reports syntax errors
	}
	errs := sharingShape(doc.Sharing)
	for i, err := range errs {
		errs[i] = fmt.Errorf("config: %s: %w", path, err)
	}
	return errors.Join(errs...)
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

func sharingShape(raw json.RawMessage) []error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return []error{fmt.Errorf("sharing: want a map with the key timeSlicing, mps, memoryShares or migPartitions (see %s)", sharingExample)}
	}
	errs := unknownKeys("sharing", top, jsonKeys(Sharing{}))
	errs = append(errs, sectionShape[TimeSlicing]("sharing.timeSlicing", top["timeSlicing"])...)
	errs = append(errs, sectionShape[MPS]("sharing.mps", top["mps"])...)
	if raw := top["memoryShares"]; !isNull(raw) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return append(errs, errors.New("sharing.memoryShares: want a map with the keys enabled, devices and minimum (example: {enabled: true, minimum: 2Gi})"))
		}
		errs = append(errs, unknownKeys("sharing.memoryShares", m, jsonKeys(MemoryShares{}))...)
		errs = append(errs, decodeKeys[MemoryShares]("sharing.memoryShares", m)...)
	}
	if raw := top["migPartitions"]; !isNull(raw) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return append(errs, errors.New("sharing.migPartitions: want a map with the keys enabled and devices (example: {enabled: true, devices: [\"2\"]})"))
		}
		errs = append(errs, unknownKeys("sharing.migPartitions", m, jsonKeys(MIGPartitions{}))...)
		errs = append(errs, decodeKeys[MIGPartitions]("sharing.migPartitions", m)...)
	}
	return errs
}

// sectionShape checks one sharing section, T its type (TimeSlicing or
// MPS), at its key path.
func sectionShape[T any](at string, raw json.RawMessage) []error {
	if isNull(raw) {
		return nil
	}
	var zero T
	var ts map[string]json.RawMessage
	if err := json.Unmarshal(raw, &ts); err != nil {
		return []error{fmt.Errorf("%s: want a map of keys such as resources (see %s)", at, sharingExample)}
	}
	errs := unknownKeys(at, ts, jsonKeys(zero))
	errs = append(errs, decodeKeys[T](at, ts, "resources")...)
	if isNull(ts["resources"]) {
		return errs
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(ts["resources"], &entries); err != nil {
		return append(errs, fmt.Errorf("%s.resources: want a list of entries, each with name and replicas (see %s)", at, sharingExample))
	}
	for i, raw := range entries {
		at := fmt.Sprintf("%s.resources[%d]", at, i)
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil || m == nil {
			errs = append(errs, fmt.Errorf("%s: want an entry with name and replicas (example: {name: nvidia.com/gpu, replicas: 4})", at))
			continue
		}
		errs = append(errs, unknownKeys(at, m, jsonKeys(SharedResource{}))...)
		errs = append(errs, decodeKeys[SharedResource](at, m)...)
	}
	return errs
}

// decodeKeys decodes each known key of m on its own into a T, so that
// every mistyped value is reported, each naming its key.
func decodeKeys[T any](at string, m map[string]json.RawMessage, skip ...string) []error {
	var zero T
	known := jsonKeys(zero)
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(known, k) || slices.Contains(skip, k) {
			continue
		}
		one, err := json.Marshal(map[string]json.RawMessage{k: m[k]})
		if err == nil {
			var v T
			err = json.Unmarshal(one, &v)
		}
		var te *json.UnmarshalTypeError
		switch {
		case err == nil:
		case errors.As(err, &te) && k == "devices":
			// typeError's hint is for NIC hex IDs; a device is a string.
			errs = append(errs, fmt.Errorf("%s.devices: got %s, want a list of strings: UUIDs (GPU-… or MIG-…) or model names in quotes", at, article(te.Value)))
		case errors.As(err, &te):
			errs = append(errs, typeError(at, te))
		default:
			errs = append(errs, fmt.Errorf("%s.%s: %w", at, k, err))
		}
	}
	return errs
}

// validateSharing checks the values of sharing and of migStrategy, each
// error naming its key path and the fix. Without withStrategy it leaves
// out what depends on migStrategy, which flags may still change: Load
// checks the file-only part, Validate all of it. Time-slicing with
// kubeletAPI dra is no error: the DRA front-end ignores time-slicing (the
// daemon logs that).
func validateSharing(c Config, withStrategy bool) []error {
	t := c.Sharing.TimeSlicing
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if t.Placement != "" && !slices.Contains(placements(), t.Placement) {
		bad("sharing.timeSlicing.placement: %q is not allowed; use one of %s, or leave it out for %s", t.Placement, strings.Join(placements(), ", "), PlacementDistributed)
	}
	v := sharingCheck{c: c, withStrategy: withStrategy, bad: bad, served: map[string]entryAt{}, nicPools: map[string]int{}}
	for i, p := range c.NICResources {
		if _, dup := v.nicPools[p.Name]; !dup {
			v.nicPools[p.Name] = i
		}
	}
	slicing := v.section(section{at: "sharing.timeSlicing", renameByDefault: t.RenameByDefault, resources: t.Resources})
	m := c.Sharing.MPS
	mps := v.section(section{at: "sharing.mps", renameByDefault: m.RenameByDefault, resources: m.Resources, mps: true})
	// A GPU is shared one way. What validation cannot see (one section
	// naming a GPU's UUID, the other its model) the layout settles.
	for name, i := range mps.catchAll {
		if j, both := slicing.catchAll[name]; both {
			bad("sharing.mps.resources[%d]: every %s would be shared through MPS, and sharing.timeSlicing.resources[%d] time-slices every %s too; a GPU is shared one way: give one of them devices", i, name, j, name)
		}
	}
	for key, w := range mps.devices {
		if o, both := slicing.devices[key]; both {
			bad("sharing.mps.resources[%d].devices[%d]: %q is also time-sliced by sharing.timeSlicing.resources[%d].devices[%d]; a GPU is shared one way: remove one", w.entry, w.device, m.Resources[w.entry].Devices[w.device], o.entry, o.device)
		}
	}
	errs = append(errs, validateMPSShares(m)...)
	if withStrategy && m.Enabled() && c.KubeletAPI == KubeletAPIDRA {
		// Serving its GPUs unshared instead would surprise.
		bad("sharing.mps: in DRA mode GPUs are shared through MPS by claims (opaque configuration, or sharing.memoryShares), not replicas; remove the section, or set kubeletAPI (--kubelet-api) to %s", KubeletAPIDevicePlugin)
	}
	errs = append(errs, validateMemoryShares(c, withStrategy)...)
	return append(errs, validateMIGPartitions(c, withStrategy)...)
}

// validateMPSShares checks maxSharesPerContainer against each entry's
// replicas and failRequestsGreaterThanOne.
func validateMPSShares(m MPS) []error {
	const at = "sharing.mps.maxSharesPerContainer"
	n := m.MaxSharesPerContainer
	switch {
	case n < 0:
		return []error{fmt.Errorf("%s: %d is too few; use 1 (the default: one share per container) or more", at, n)}
	case n > 1 && m.FailRequestsGreaterThanOne:
		return []error{fmt.Errorf("%s: %d shares per container, but sharing.mps.failRequestsGreaterThanOne is true, which allows one; remove one of the two keys", at, n)}
	}
	var errs []error
	for i, r := range m.Resources {
		if r.Replicas >= 2 && n > r.Replicas {
			errs = append(errs, fmt.Errorf("%s: %d is more than the %d replicas of sharing.mps.resources[%d]; use at most %d, or give that entry more replicas", at, n, r.Replicas, i, r.Replicas))
		}
	}
	return errs
}

// section is one sharing section as validateSharing sees it.
type section struct {
	at              string // key path: sharing.timeSlicing or sharing.mps
	renameByDefault bool
	resources       []SharedResource
	mps             bool // whole GPUs only
}

type entryAt struct {
	at   string // the entry's key path
	name string // its resource
}

type seenAt struct{ entry, device int }

// selected is what a section selects: per resource name, the entry
// without devices, and per resource name + "\x00" + lower-case device,
// where it is named.
type selected struct {
	catchAll map[string]int
	devices  map[string]seenAt
}

// sharingCheck holds what the checks of both sections share: replicas of
// either are served under names that must not collide.
type sharingCheck struct {
	c            Config
	withStrategy bool
	bad          func(format string, a ...any)
	served       map[string]entryAt // replicated resource name -> first entry serving it
	nicPools     map[string]int     // NIC pool name -> index
}

// section checks one section's entries.
func (v sharingCheck) section(sec section) selected {
	c, bad, ts := v.c, v.bad, sec.at
	sel := selected{catchAll: map[string]int{}, devices: map[string]seenAt{}}
	for i, r := range sec.resources {
		at := fmt.Sprintf("%s.resources[%d]", ts, i)
		nameOK := true
		switch {
		case r.Name == "" && sec.mps:
			nameOK = false
			bad("%s.name: missing; use nvidia.com/gpu (MPS shares whole GPUs)", at)
		case r.Name == "":
			nameOK = false
			bad("%s.name: missing; use nvidia.com/gpu or nvidia.com/mig-<profile> as served (example: nvidia.com/mig-1g.10gb)", at)
		case r.Name == resname.GPU:
		case sec.mps && strings.HasPrefix(r.Name, resname.MIGPrefix):
			nameOK = false
			bad("%s.name: %q is a MIG resource, and the plugin runs MPS on whole GPUs only; use nvidia.com/gpu, or share MIG devices with sharing.timeSlicing", at, r.Name)
		case migResource.MatchString(r.Name):
		case strings.HasPrefix(r.Name, resname.MIGPrefix) && strings.Contains(r.Name, "+"):
			nameOK = false
			bad("%s.name: %q is not served: MIG resource names write a profile's \"+\" as \".\"; use %q", at, r.Name, strings.ReplaceAll(r.Name, "+", "."))
		case sec.mps:
			nameOK = false
			bad("%s.name: %q is not a resource MPS can share; use nvidia.com/gpu", at, r.Name)
		default:
			nameOK = false
			bad("%s.name: %q is not a resource the plugin serves; use nvidia.com/gpu or nvidia.com/mig-<profile> as served (example: nvidia.com/mig-1g.10gb)", at, r.Name)
		}
		maxReplicas, why := MaxReplicas, ""
		if sec.mps {
			maxReplicas, why = MaxMPSReplicas, " (an MPS server takes at most 48 client processes per GPU, and each replica runs at least one)"
		}
		switch {
		case r.Replicas < 2:
			bad("%s.replicas: %d is too few; use 2 or more (1 is not sharing: remove the entry)", at, r.Replicas)
		case r.Replicas > maxReplicas:
			bad("%s.replicas: %d is too many; use at most %d%s", at, r.Replicas, maxReplicas, why)
		}
		if r.Rename != "" {
			switch err := checkResourceName(r.Rename); {
			case r.Rename == r.Name:
				bad("%s.rename: %q is the entry's own name; leave rename out to serve the replicas under it, or pick another name (example: %s.shared)", at, r.Rename, r.Name)
			case r.Rename == resname.GPU || strings.HasPrefix(r.Rename, resname.MIGPrefix):
				bad("%s.rename: %q is a name the plugin serves devices under; pick another (example: %s.shared)", at, r.Rename, r.Name)
			case err != nil:
				bad("%s.rename: %q %v (example: nvidia.com/gpu.shared)", at, r.Rename, err)
			}
		}
		if nameOK {
			as := servedName(r, sec.renameByDefault)
			pool, isPool := v.nicPools[as]
			first, isServed := v.served[as]
			switch {
			case isPool:
				bad("%s: replicas would be served as %q, already the name of nicResources[%d]; set another rename", at, as, pool)
			case isServed && first.name != r.Name:
				bad("%s: replicas of %s would be served as %q, as are those of %s (%s); a resource serves one kind of device: set another rename", at, r.Name, as, first.name, first.at)
			case isServed && !strings.HasPrefix(first.at, ts+"."):
				bad("%s: replicas would be served as %q, as are those of %s, which shares its devices the other way; a resource is shared one way: set another rename", at, as, first.at)
			case !isServed:
				v.served[as] = entryAt{at: at, name: r.Name}
			}
		}
		if len(r.Devices) == 0 {
			if j, dup := sel.catchAll[r.Name]; dup {
				bad("%s: a second entry for %s without devices (%s.resources[%d] has none either), so two replica counts would apply to the same devices; give one devices, or remove one", at, r.Name, ts, j)
			} else {
				sel.catchAll[r.Name] = i
			}
		}
		for k, d := range r.Devices {
			dat := fmt.Sprintf("%s.devices[%d]", at, k)
			switch {
			case strings.TrimSpace(d) == "":
				bad("%s: empty; use a UUID (GPU-… or MIG-…, as `gpu-device-plugin list` shows) or a model name (example: \"NVIDIA H100 80GB HBM3\")", dat)
				continue
			case strings.TrimSpace(d) != d:
				bad("%s: %q has spaces around it, so it matches no device; use %q", dat, d, strings.TrimSpace(d))
				continue
			case isAllDigits(d):
				bad("%s: %q looks like a device index, which is not accepted (indexes change when a GPU fails or MIG is reconfigured); use the UUID (as `gpu-device-plugin list` shows) or the model name", dat, d)
				continue
			case sec.mps && strings.HasPrefix(strings.ToUpper(d), "MIG-"):
				bad("%s: %q is a MIG device, and the plugin runs MPS on whole GPUs only; name a GPU (GPU- UUID or model name), or share the MIG device with sharing.timeSlicing", dat, d)
				continue
			case strings.HasPrefix(strings.ToUpper(d), "GPU-") && migResource.MatchString(r.Name):
				bad("%s: %q is a GPU UUID, which names no device of %s; use the MIG device's MIG- UUID, or the model name of its GPU", dat, d, r.Name)
				continue
			}
			key := r.Name + "\x00" + strings.ToLower(d)
			if w, dup := sel.devices[key]; dup {
				bad("%s: %q is already selected for %s by %s.resources[%d].devices[%d]; a device gets one replica count: remove one", dat, d, r.Name, ts, w.entry, w.device)
			} else {
				sel.devices[key] = seenAt{i, k}
			}
		}
		if !v.withStrategy || !nameOK || !slices.Contains(migStrategies(), c.MIGStrategy) {
			continue // an unknown migStrategy is reported on its own
		}
		switch {
		case migResource.MatchString(r.Name) && c.MIGStrategy == MIGStrategySingle:
			bad("%s.name: %q is never served with migStrategy %s, which serves MIG devices as %s; use name %s, or migStrategy %s", at, r.Name, MIGStrategySingle, resname.GPU, resname.GPU, MIGStrategyMixed)
		case migResource.MatchString(r.Name) && c.MIGStrategy == MIGStrategyNone:
			bad("%s.name: %q is never served with migStrategy %s, which serves no MIG device; set migStrategy %s", at, r.Name, MIGStrategyNone, MIGStrategyMixed)
		case r.Name == resname.GPU && c.MIGStrategy != MIGStrategySingle:
			for k, d := range r.Devices {
				if strings.HasPrefix(strings.ToUpper(d), "MIG-") {
					bad("%s.devices[%d]: %q is a MIG device, which migStrategy %s never serves as %s; name it under nvidia.com/mig-<profile> with migStrategy %s", at, k, d, c.MIGStrategy, resname.GPU, MIGStrategyMixed)
				}
			}
		}
	}
	return sel
}

func isAllDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}
