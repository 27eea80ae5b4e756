package podresources

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// A checkpoint as kubelet 1.37 writes it (checkpoint.Data marshalled:
// DeviceIDs by NUMA node, AllocResp as base64), with two pods' entries.
const checkpointNUMA = `{"Data":{"PodDeviceEntries":[
 {"PodUID":"uid-a","ContainerName":"trainer","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-1"],"1":["GPU-3"]},"AllocResp":"CgA="},
 {"PodUID":"uid-a","ContainerName":"sidecar","ResourceName":"example.com/rdma","DeviceIDs":{"0":["0000:18:00.1"]},"AllocResp":"CgA="},
 {"PodUID":"uid-b","ContainerName":"trainer","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["GPU-2"]},"AllocResp":"CgA="}],
 "RegisteredDevices":{"nvidia.com/gpu":["GPU-1","GPU-2","GPU-3"]}},"Checksum":1234567890}`

// The same as kubelets before 1.20 wrote it: DeviceIDs a plain list.
const checkpointList = `{"Data":{"PodDeviceEntries":[
 {"PodUID":"uid-a","ContainerName":"trainer","ResourceName":"nvidia.com/gpu","DeviceIDs":["GPU-3","GPU-1"],"AllocResp":"CgA="},
 {"PodUID":"uid-b","ContainerName":"trainer","ResourceName":"nvidia.com/gpu","DeviceIDs":["GPU-2"],"AllocResp":"CgA="}],
 "RegisteredDevices":{}},"Checksum":42}`

func TestParseCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []Entry
		err      string // part of the error; "" parses
	}{
		{"by NUMA node", checkpointNUMA, []Entry{
			{"uid-a", "trainer", "nvidia.com/gpu", []string{"GPU-1", "GPU-3"}},
			{"uid-a", "sidecar", "example.com/rdma", []string{"0000:18:00.1"}},
			{"uid-b", "trainer", "nvidia.com/gpu", []string{"GPU-2"}},
		}, ""},
		{"a plain list (before 1.20)", checkpointList, []Entry{
			{"uid-a", "trainer", "nvidia.com/gpu", []string{"GPU-1", "GPU-3"}},
			{"uid-b", "trainer", "nvidia.com/gpu", []string{"GPU-2"}},
		}, ""},
		{"no entries", `{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":0}`, nil, ""},
		{"an entry without devices", `{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r","DeviceIDs":null}]}}`,
			[]Entry{{"u", "c", "r", nil}}, ""},
		{"an entry without a pod UID is skipped", `{"Data":{"PodDeviceEntries":[{"ContainerName":"c","ResourceName":"r","DeviceIDs":["x"]}]}}`, nil, ""},
		{"the same ID on two NUMA nodes once", `{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r","DeviceIDs":{"0":["x"],"1":["x"]}}]}}`,
			[]Entry{{"u", "c", "r", []string{"x"}}}, ""},

		{"empty file", ``, nil, "unexpected end of JSON input"},
		{"truncated", checkpointNUMA[:len(checkpointNUMA)/2], nil, "unexpected end of JSON input"},
		{"not JSON", `kubelet`, nil, "invalid character"},
		{"another checkpoint (the CPU manager's)", `{"policyName":"none","defaultCpuSet":"","checksum":1}`, nil, "no Data"},
		{"entries not a list", `{"Data":{"PodDeviceEntries":{}}}`, nil, "cannot unmarshal"},
		{"DeviceIDs a string", `{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r","DeviceIDs":"GPU-1"}]}}`, nil, "PodDeviceEntries[0].DeviceIDs"},
		{"DeviceIDs by a NUMA node that is no number", `{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r","DeviceIDs":{"zero":["x"]}}]}}`, nil, `NUMA node "zero"`},
		{"DeviceIDs holding numbers", `{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r","DeviceIDs":{"0":[1]}}]}}`, nil, "PodDeviceEntries[0].DeviceIDs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, err := ParseCheckpoint([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want ErrMalformed with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := cp.Entries()
			if !slices.EqualFunc(got, tc.want, func(a, b Entry) bool {
				return a.PodUID == b.PodUID && a.Container == b.Container && a.Resource == b.Resource && slices.Equal(a.IDs, b.IDs)
			}) {
				t.Errorf("entries %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadCheckpoint(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, CheckpointFile)
	if _, err := ReadCheckpoint(path); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing checkpoint: %v, want a not-exist error", err)
	}
	if err := os.WriteFile(path, []byte(checkpointNUMA), 0o600); err != nil {
		t.Fatal(err)
	}
	cp, err := ReadCheckpoint(path)
	if err != nil || len(cp.Entries()) != 3 {
		t.Fatalf("ReadCheckpoint = %d entries, %v", len(cp.Entries()), err)
	}
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCheckpoint(path); err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), path) {
		t.Errorf("a malformed checkpoint: %v, want ErrMalformed naming %s", err, path)
	}
}

// A container's devices, as PodResources lists them, find its pod's UID in
// the checkpoint, in either DeviceIDs shape.
func TestCheckpointPodUID(t *testing.T) {
	list := &v1.ListPodResourcesResponse{PodResources: []*v1.PodResources{
		{Name: "train-a", Namespace: "ml", Containers: []*v1.ContainerResources{
			{Name: "trainer", Devices: []*v1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-3", "GPU-1"}}}},
			{Name: "sidecar", Devices: []*v1.ContainerDevices{{ResourceName: "example.com/rdma", DeviceIds: []string{"0000:18:00.1"}}}},
			{Name: "idle"},
		}},
		{Name: "train-b", Namespace: "ml", Containers: []*v1.ContainerResources{
			{Name: "trainer", Devices: []*v1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-2"}}}},
		}},
		// A pod the checkpoint does not know yet (its entry not written).
		{Name: "new", Namespace: "ml", Containers: []*v1.ContainerResources{
			{Name: "trainer", Devices: []*v1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-4"}}}},
		}},
	}}
	wire, err := proto.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := DecodeList(wire)
	if err != nil {
		t.Fatal(err)
	}
	h := FromList(pods)
	// A gone pod's entries stay in the checkpoint a while: GPU-2 twice.
	withGone := `{"Data":{"PodDeviceEntries":[
	 {"PodUID":"uid-b","ContainerName":"trainer","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-2"]}},
	 {"PodUID":"uid-gone","ContainerName":"trainer","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-2"]}}]}}`
	for _, tc := range []struct {
		name, checkpoint string
		who              Holder
		want             string
	}{
		{"two GPUs on two NUMA nodes", checkpointNUMA, Holder{"ml", "train-a", "trainer"}, "uid-a"},
		{"another resource of the same pod", checkpointNUMA, Holder{"ml", "train-a", "sidecar"}, "uid-a"},
		{"another pod, same container name", checkpointNUMA, Holder{"ml", "train-b", "trainer"}, "uid-b"},
		{"the old plain list", checkpointList, Holder{"ml", "train-a", "trainer"}, "uid-a"},
		{"no entry yet", checkpointNUMA, Holder{"ml", "new", "trainer"}, ""},
		{"a container without devices", checkpointNUMA, Holder{"ml", "train-a", "idle"}, ""},
		{"the same devices in two pods' entries", withGone, Holder{"ml", "train-b", "trainer"}, ""},
		{"an empty checkpoint", `{"Data":{}}`, Holder{"ml", "train-a", "trainer"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, err := ParseCheckpoint([]byte(tc.checkpoint))
			if err != nil {
				t.Fatal(err)
			}
			if got := cp.PodUID(tc.who.Container, h.DevicesOf(tc.who)); got != tc.want {
				t.Errorf("PodUID(%s) = %q, want %q", tc.who, got, tc.want)
			}
		})
	}
	// Only a container's whole device set matches: one GPU of two is not it.
	cp, _ := ParseCheckpoint([]byte(checkpointNUMA))
	if got := cp.PodUID("trainer", map[string][]string{"nvidia.com/gpu": {"GPU-1"}}); got != "" {
		t.Errorf("a part of a container's devices matched %q", got)
	}
}
