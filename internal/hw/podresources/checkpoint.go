package podresources

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
)

// CheckpointFile is the kubelet device manager's checkpoint, in the
// kubelet's device-plugins directory (kubeletDeviceManagerCheckpoint in
// k8s.io/kubernetes pkg/kubelet/cm/devicemanager).
const CheckpointFile = "kubelet_internal_checkpoint"

// maxCheckpoint bounds what is read of the checkpoint: a busy node's is a
// few hundred KiB; a larger one is not the kubelet's.
const maxCheckpoint = 64 << 20

// Entry is one container's devices of one resource, as the kubelet's
// device manager keeps them.
type Entry struct {
	PodUID    string
	Container string
	Resource  string
	IDs       []string // sorted
}

// Checkpoint is the device manager's checkpoint: who got which device IDs
// through the device-plugin API, by pod UID. The PodResources API says the
// same by pod name, but without the UID, which an Event needs.
type Checkpoint struct {
	entries []Entry
}

// ReadCheckpoint reads and parses the checkpoint at path.
func ReadCheckpoint(path string) (Checkpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("reading the kubelet's device checkpoint: %w", err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(io.LimitReader(f, maxCheckpoint+1)); err != nil {
		return Checkpoint{}, fmt.Errorf("reading the kubelet's device checkpoint %s: %w", path, err)
	}
	if b.Len() > maxCheckpoint {
		return Checkpoint{}, fmt.Errorf("the kubelet's device checkpoint %s is larger than %d bytes", path, maxCheckpoint)
	}
	cp, err := ParseCheckpoint(b.Bytes())
	if err != nil {
		return Checkpoint{}, fmt.Errorf("the kubelet's device checkpoint %s: %w", path, err)
	}
	return cp, nil
}

// ErrMalformed is wrapped by every error ParseCheckpoint returns.
var ErrMalformed = errors.New("not a device-manager checkpoint")

// ParseCheckpoint parses the checkpoint's JSON:
//
//	{"Data":{"PodDeviceEntries":[{"PodUID","ContainerName","ResourceName",
//	 "DeviceIDs":{"<NUMA node>":[ids]},"AllocResp"}],"RegisteredDevices":{...}},
//	 "Checksum":N}
//
// Kubelets before 1.20 wrote DeviceIDs as a plain list; both are read. The
// checksum is the kubelet's own hash of its Go values and is not checked:
// the kubelet replaces the file by a rename, so it is never read half
// written. An entry without a pod UID, container or resource is skipped.
func ParseCheckpoint(data []byte) (Checkpoint, error) {
	var raw struct {
		Data *struct {
			PodDeviceEntries []struct {
				PodUID        string
				ContainerName string
				ResourceName  string
				DeviceIDs     json.RawMessage
			}
		}
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if raw.Data == nil {
		return Checkpoint{}, fmt.Errorf("%w: no Data", ErrMalformed)
	}
	var cp Checkpoint
	for i, e := range raw.Data.PodDeviceEntries {
		ids, err := deviceIDs(e.DeviceIDs)
		if err != nil {
			return Checkpoint{}, fmt.Errorf("%w: PodDeviceEntries[%d].DeviceIDs: %w", ErrMalformed, i, err)
		}
		if e.PodUID == "" || e.ContainerName == "" || e.ResourceName == "" {
			continue
		}
		slices.Sort(ids)
		cp.entries = append(cp.entries, Entry{PodUID: e.PodUID, Container: e.ContainerName, Resource: e.ResourceName, IDs: slices.Compact(ids)})
	}
	return cp, nil
}

// deviceIDs reads DeviceIDs: by NUMA node (1.20+), or a plain list.
func deviceIDs(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	if raw[0] == '[' {
		var ids []string
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, err
		}
		return ids, nil
	}
	var byNUMA map[string][]string
	if err := json.Unmarshal(raw, &byNUMA); err != nil {
		return nil, err
	}
	var ids []string
	for node, l := range byNUMA {
		if _, err := strconv.ParseInt(node, 10, 64); err != nil {
			return nil, fmt.Errorf("NUMA node %q is not a number", node)
		}
		ids = append(ids, l...)
	}
	return ids, nil
}

// Entries are the checkpoint's entries, in its order.
func (c Checkpoint) Entries() []Entry { return slices.Clone(c.entries) }

// PodUID is the UID of the pod whose container c holds devices, the
// container's devices of each resource as PodResources lists them: the
// entries of that container name and resource with the same device IDs.
// Device IDs of a resource go to one container at a time, but the kubelet
// drops a gone pod's entries only later, so "" when none or more than one
// pod matches.
func (c Checkpoint) PodUID(container string, devices map[string][]string) string {
	uid := ""
	for res, ids := range devices {
		want := slices.Compact(slices.Sorted(slices.Values(ids)))
		for _, e := range c.entries {
			if e.Container != container || e.Resource != res || !slices.Equal(e.IDs, want) {
				continue
			}
			if uid != "" && uid != e.PodUID {
				return ""
			}
			uid = e.PodUID
		}
	}
	return uid
}
