package nvidia

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Result is NVIDIA's settings turned into ours.
type Result struct {
	// Config holds our keys and their values, as the config file takes
	// them.
	Config map[string]any
	// Notes has one line per NVIDIA setting, or part of one, that was not
	// carried over: which, why, and what to do instead.
	Notes []string
}

func (r *Result) note(at, why string) { r.Notes = append(r.Notes, at+": "+why) }

// sharingSection is our sharing.<name> map (timeSlicing, mps), made on
// first use.
func (r *Result) sharingSection(name string) map[string]any {
	sharing, _ := r.Config["sharing"].(map[string]any)
	if sharing == nil {
		sharing = map[string]any{}
		r.Config["sharing"] = sharing
	}
	sec, _ := sharing[name].(map[string]any)
	if sec == nil {
		sec = map[string]any{}
		sharing[name] = sec
	}
	return sec
}

// topLevel are the keys of NVIDIA's v1 file.
func topLevel() []string { return []string{"version", "flags", "resources", "sharing", "imex"} }

// Convert turns NVIDIA's file (nil for none) and NVIDIA's variables, as
// lookup finds them, into our settings. The variables win over the file,
// as they do in NVIDIA's plugin; an empty one counts as unset.
func Convert(file []byte, lookup func(string) (string, bool)) (Result, error) {
	r := Result{Config: map[string]any{}}
	given := map[string]json.RawMessage{} // Key.ID -> value
	where := map[string]string{}          // Key.ID -> file key or variable, for notes
	if file != nil {
		var top map[string]json.RawMessage
		if err := yaml.Unmarshal(file, &top); err != nil {
			return r, fmt.Errorf("reading NVIDIA's config: %w", err)
		}
		if len(top) > 0 && !slices.ContainsFunc(slices.Collect(maps.Keys(top)), func(k string) bool { return slices.Contains(topLevel(), k) }) {
			return r, fmt.Errorf("reading NVIDIA's config: none of its top-level keys (%s) is there; is the file in gpu-device-plugin's format already?", strings.Join(topLevel(), ", "))
		}
		if v, ok := top["version"]; ok {
			var s string
			if json.Unmarshal(v, &s) != nil || s != "v1" {
				r.note("version", fmt.Sprintf("%s is not v1; read as v1", v))
			}
			delete(top, "version")
		}
		byFile := map[string]Key{}
		for _, k := range Keys() {
			if k.File != "" {
				byFile[k.File] = k
			}
		}
		walk(&r, "", top, byFile, func(k Key, v json.RawMessage) {
			given[k.ID()], where[k.ID()] = v, k.File
		})
	}
	if lookup != nil {
		for _, f := range InEnv(lookup) {
			v, _ := json.Marshal(f.Value)
			given[f.Key.ID()], where[f.Key.ID()] = v, f.Env
		}
	}
	for _, k := range Keys() {
		v, ok := given[k.ID()]
		if !ok {
			continue
		}
		if k.move == nil {
			r.note(where[k.ID()], k.whyNot())
			continue
		}
		k.move(&r, where[k.ID()], v)
	}
	return r, nil
}

// whyNot is the note for a setting that is not carried over.
func (k Key) whyNot() string {
	if k.Ours == "" {
		return "not carried over, no counterpart here: " + k.Note
	}
	return "not carried over: " + strings.TrimPrefix(k.Note, "not carried over: ") + " (counterpart: " + k.Counterpart() + ")"
}

// walk finds the table's keys in the map m at prefix, and notes each key
// that is neither one of them nor a map holding some. Null values are
// unset.
func walk(r *Result, prefix string, m map[string]json.RawMessage, byFile map[string]Key, found func(Key, json.RawMessage)) {
	for _, name := range slices.Sorted(maps.Keys(m)) {
		v, at := m[name], prefix+name
		if isNull(v) {
			continue
		}
		if k, ok := byFile[at]; ok {
			found(k, v)
			continue
		}
		var sub map[string]json.RawMessage
		if hasUnder(byFile, at) && json.Unmarshal(v, &sub) == nil {
			walk(r, at+".", sub, byFile, found)
			continue
		}
		r.note(at, "unknown NVIDIA key, left out; check its spelling against NVIDIA's v1 format")
	}
}

func hasUnder(byFile map[string]Key, at string) bool {
	for k := range byFile {
		if strings.HasPrefix(k, at+".") {
			return true
		}
	}
	return false
}

func isNull(v json.RawMessage) bool { return len(v) == 0 || string(v) == "null" }

// timeSlicing carries sharing.timeSlicing over: the shape is ours too.
func timeSlicing(r *Result, at string, v json.RawMessage) {
	shared(r, at, v, r.sharingSection("timeSlicing"), "time-slicing")
}

// mps carries sharing.mps over. NVIDIA's plugin gives each container one
// MPS share, whatever failRequestsGreaterThanOne says, and so does ours
// by default (maxSharesPerContainer 1), so the section carries as it is.
func mps(r *Result, at string, v json.RawMessage) {
	shared(r, at, v, r.sharingSection("mps"), "MPS")
}

// shared carries a sharing section of NVIDIA's (renameByDefault,
// failRequestsGreaterThanOne, resources) into sec.
func shared(r *Result, at string, v json.RawMessage, sec map[string]any, what string) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil {
		r.note(at, "want a map with resources; left out")
		return
	}
	for _, name := range slices.Sorted(maps.Keys(m)) {
		v := m[name]
		switch name {
		case "renameByDefault", "failRequestsGreaterThanOne":
			var b bool
			if err := json.Unmarshal(v, &b); err != nil {
				r.note(at+"."+name, fmt.Sprintf("want true or false, got %s; left out", v))
				continue
			}
			sec[name] = b
		case "resources":
			var entries []map[string]json.RawMessage
			if err := json.Unmarshal(v, &entries); err != nil {
				r.note(at+".resources", "want a list of entries with name and replicas; left out")
				continue
			}
			var out []any
			for i, e := range entries {
				if entry, ok := sharedResource(r, fmt.Sprintf("%s.resources[%d]", at, i), e); ok {
					out = append(out, entry)
				}
			}
			if len(out) > 0 {
				sec["resources"] = out
			}
		default:
			r.note(at+"."+name, "unknown NVIDIA key, left out; "+what+" takes renameByDefault, failRequestsGreaterThanOne, resources")
		}
	}
}

// sharedResource converts one entry of resources; false drops it, with a
// note saying why.
func sharedResource(r *Result, at string, e map[string]json.RawMessage) (map[string]any, bool) {
	out := map[string]any{}
	for _, name := range slices.Sorted(maps.Keys(e)) {
		v := e[name]
		switch name {
		case "name", "rename", "replicas":
			var x any
			if err := json.Unmarshal(v, &x); err != nil {
				r.note(at+"."+name, fmt.Sprintf("%s is not a value; entry left out", v))
				return nil, false
			}
			out[name] = x
		case "devices":
			devices, ok := replicatedDevices(r, at+".devices", v)
			if !ok {
				return nil, false
			}
			if len(devices) > 0 {
				out["devices"] = devices
			}
		default:
			r.note(at+"."+name, "unknown NVIDIA key, left out; an entry takes name, rename, replicas, devices")
		}
	}
	return out, true
}

// replicatedDevices takes NVIDIA's "all" (every device: no list here), a
// list of UUIDs (kept), or a count or indexes, which have no counterpart:
// indexes change when a GPU fails or MIG is reconfigured.
func replicatedDevices(r *Result, at string, v json.RawMessage) ([]string, bool) {
	const instead = "list the devices' UUIDs or their model name, as `gpu-device-plugin list` shows them, and add the entry by hand"
	var s string
	if json.Unmarshal(v, &s) == nil && s == "all" {
		return nil, true
	}
	var n int
	if json.Unmarshal(v, &n) == nil {
		r.note(at, fmt.Sprintf("a count (%d) has no counterpart; entry left out: %s", n, instead))
		return nil, false
	}
	var list []json.RawMessage
	if err := json.Unmarshal(v, &list); err != nil {
		r.note(at, fmt.Sprintf("want all or a list of UUIDs, got %s; entry left out", v))
		return nil, false
	}
	var out []string
	for i, item := range list {
		var d string
		if json.Unmarshal(item, &d) != nil {
			d = string(item) // a bare number: an index
		}
		if isIndex(d) {
			r.note(fmt.Sprintf("%s[%d]", at, i), fmt.Sprintf("%q is a device index, which has no counterpart; entry left out: %s", d, instead))
			return nil, false
		}
		out = append(out, d)
	}
	return out, true
}

// isIndex says whether d is a GPU index ("0") or a MIG index ("0:1").
func isIndex(d string) bool {
	for _, part := range strings.SplitN(d, ":", 2) {
		if _, err := strconv.ParseUint(part, 10, 32); err != nil {
			return false
		}
	}
	return true
}
