package mocknvml

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// MIGState is what the library keeps in its state file (the path in
// MOCK_NVML_MIG_STATE): the GPU and compute instances of every GPU a
// create or destroy has touched, shared by every process using the mock as
// one driver's state is. A GPU the file does not name holds its profile's
// mig lines. README.md describes the format.
type MIGState struct {
	// Counter is the number of compute instances created so far; each new
	// MIG device's UUID is derived from it.
	Counter uint64
	GPUs    []MIGStateGPU
}

// MIGStateGPU is one GPU's instances.
type MIGStateGPU struct {
	UUID             string
	GPUInstances     []MIGStateGI
	ComputeInstances []MIGStateCI
}

// MIGStateGI is a GPU instance: its id, the driver's profile ID (9 for a
// 3g.40gb), its placement in memory slices, its memory.
type MIGStateGI struct {
	ID, ProfileID, Start, Size int
	MemoryMiB                  uint64
}

// MIGStateCI is a compute instance, a MIG device: its GPU instance and id,
// its compute instance profile ID, its placement in the GPU instance's
// compute slices, its MIG device index, SMs, name ("3g.40gb",
// "1c.3g.40gb") and UUID.
type MIGStateCI struct {
	GPUInstance, ID, ProfileID, Start, Size, Index int
	Multiprocessors                                int
	Name, UUID                                     string
}

// GPU returns the instances the file holds for the GPU with that UUID;
// false when it names no such GPU (the GPU has its profile's).
func (s *MIGState) GPU(uuid string) (MIGStateGPU, bool) {
	for _, g := range s.GPUs {
		if g.UUID == uuid {
			return g, true
		}
	}
	return MIGStateGPU{}, false
}

// LoadMIGState reads a state file the library wrote. It checks the form
// only; the library checks the instances against the profile. A missing
// file is an error that wraps fs.ErrNotExist (no create or destroy has
// happened).
func LoadMIGState(path string) (*MIGState, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading MIG state: %w", err)
	}
	defer f.Close()
	s := &MIGState{}
	sc := bufio.NewScanner(f)
	line, version := 0, false
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s:%d: %s", path, line, fmt.Sprintf(format, args...))
	}
	for sc.Scan() {
		line++
		tok, ok := tokenize(sc.Text())
		if !ok {
			return nil, bad("unterminated quote")
		}
		if len(tok) == 0 {
			continue
		}
		if !version && tok[0] != "version" {
			return nil, bad("the file must start with version 1")
		}
		keys := map[string]string{}
		for _, w := range tok[1:] {
			if k, v, ok := strings.Cut(w, "="); ok {
				keys[k] = v
			}
		}
		num := func(key string) int {
			v, e := strconv.Atoi(keys[key])
			if e != nil && err == nil {
				err = bad("%s %s=%q is not a number", tok[0], key, keys[key])
			}
			return v
		}
		switch tok[0] {
		case "version":
			if len(tok) != 2 || tok[1] != "1" {
				return nil, bad("version %v: this reader knows version 1", tok[1:])
			}
			version = true
		case "counter":
			if len(tok) != 2 {
				return nil, bad("usage: counter <creations>")
			}
			if s.Counter, err = strconv.ParseUint(tok[1], 10, 64); err != nil {
				return nil, bad("counter %s is not a number", tok[1])
			}
		case "gpu":
			if keys["uuid"] == "" {
				return nil, bad("usage: gpu uuid=GPU-...")
			}
			s.GPUs = append(s.GPUs, MIGStateGPU{UUID: keys["uuid"]})
		case "gi", "ci":
			if len(s.GPUs) == 0 {
				return nil, bad("%s before any gpu line", tok[0])
			}
			g := &s.GPUs[len(s.GPUs)-1]
			if tok[0] == "gi" {
				gi := MIGStateGI{ID: num("id"), ProfileID: num("profile"), Start: num("start"), Size: num("size")}
				gi.MemoryMiB, _ = strconv.ParseUint(keys["memory"], 10, 64)
				g.GPUInstances = append(g.GPUInstances, gi)
			} else {
				ci := MIGStateCI{GPUInstance: num("gi"), ID: num("id"), ProfileID: num("profile"), Start: num("start"),
					Size: num("size"), Index: num("index"), Name: keys["name"], UUID: keys["uuid"]}
				ci.Multiprocessors, _ = strconv.Atoi(keys["sms"])
				g.ComputeInstances = append(g.ComputeInstances, ci)
			}
			if err != nil {
				return nil, err
			}
		default:
			return nil, bad("unknown keyword %s (want version, counter, gpu, gi or ci)", tok[0])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading MIG state %s: %w", path, err)
	}
	if !version {
		return nil, fmt.Errorf("%s: empty: the file must start with version 1", path)
	}
	return s, nil
}
