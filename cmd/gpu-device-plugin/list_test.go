package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-device-plugin/gpu-device-plugin/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/sysfs/sysfstest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.* from what list prints now")

// linkDown takes the link of 0000:40:00.0 (pool rdma_numa0) down, its
// InfiniBand port and its IPoIB netdev ibp64s0 both, so the golden listing
// shows an unhealthy NIC with its reason.
const linkDown = `
file sys/devices/pci0000:00/0000:40:00.0/net/ibp64s0/operstate down
file sys/devices/pci0000:00/0000:40:00.0/net/ibp64s0/carrier 0
file sys/devices/pci0000:00/0000:40:00.0/infiniband/mlx5_1/ports/1/state 1: DOWN
file sys/devices/pci0000:00/0000:40:00.0/infiniband/mlx5_1/ports/1/phys_state 3: Disabled
`

// TestListGolden pins `list` and `list -o json` on a fixed node: the mock
// DGX A100 with fixed UUIDs and GPU 1 too hot, the dgx-h100 sysfs tree
// with one link down, and the example NIC pools. The JSON keys are an
// interface scripts read; a change to the golden JSON must be on purpose
// and go into the README. Refresh with `go test ./cmd/gpu-device-plugin -run
// TestListGolden -update`.
func TestListGolden(t *testing.T) {
	root := sysfstest.Load(t, "dgx-h100")
	sysfstest.Apply(t, root, linkDown)
	open := func(string) (nvml.Library, error) {
		s := nvmltest.NewDGXA100()
		for i := range s.Devices {
			nvmltest.Device(s, i).UUID = fmt.Sprintf("GPU-00000000-0000-0000-0000-00000000000%d", i)
		}
		nvmltest.Device(s, 1).GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 92, gonvml.SUCCESS }
		return s, nil
	}
	args := []string{"--config", "../../config/testdata/example-nics.yaml", "--node-name", "golden-node",
		"--sysfs-root", filepath.Join(root, "sys"), "--proc-root", filepath.Join(root, "proc"), "--dev-root", filepath.Join(root, "dev")}

	tests := []struct {
		name, golden string
		args         []string
		// normalize turns stdout into what is compared.
		normalize func(t *testing.T, out string) []byte
	}{
		{name: "table", golden: "list.golden.txt", args: []string{"list"},
			normalize: func(_ *testing.T, out string) []byte { return []byte(out) }},
		{name: "json", golden: "list.golden.json", args: []string{"list", "-o", "json"}, normalize: withoutPCINames},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, stderr, err := run(t, open, append(tt.args, args...)...)
			if err != nil {
				t.Fatalf("%v\nstderr:\n%s", err, stderr)
			}
			got := tt.normalize(t, out)
			path := filepath.Join("testdata", tt.golden)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("list output differs from %s (if the change is meant, run with -update and update the README):\n--- got\n%s\n--- want\n%s", path, got, want)
			}
		})
	}
}

// withoutPCINames blanks vendorName and deviceName: they come from the
// machine's own pci.ids (list has no setting to point it elsewhere), so
// they differ between machines. The keys stay. It decodes strictly, so a
// key list prints that listing lacks fails here.
func withoutPCINames(t *testing.T, out string) []byte {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(out)))
	dec.DisallowUnknownFields()
	var l listing
	if err := dec.Decode(&l); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for i := range l.NICs {
		l.NICs[i].VendorName, l.NICs[i].DeviceName = "", ""
	}
	var b bytes.Buffer
	if err := writeJSON(&b, l); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestListJSONKeysAreLowerCamelCase: every key of every GPU and NIC, and
// of the listing itself, starts with a lower-case letter, even on a node
// with nothing to report.
func TestListJSONKeysAreLowerCamelCase(t *testing.T) {
	root := sysfstest.Load(t, "dgx-h100")
	out, _, err := run(t, mockOpen, "list", "-o", "json", "--config", "../../config/testdata/example-nics.yaml",
		"--sysfs-root", filepath.Join(root, "sys"), "--proc-root", filepath.Join(root, "proc"), "--dev-root", filepath.Join(root, "dev"))
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		GPUs []map[string]any `json:"gpus"`
		NICs []map[string]any `json:"nics"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	if len(l.GPUs) == 0 || len(l.NICs) == 0 {
		t.Fatalf("listed %d GPUs and %d NICs, want some of each", len(l.GPUs), len(l.NICs))
	}
	var top map[string]any
	if err := json.Unmarshal([]byte(out), &top); err != nil {
		t.Fatal(err)
	}
	objects := append([]map[string]any{top}, append(l.GPUs, l.NICs...)...)
	for _, o := range objects {
		for k := range o {
			if k == "" || k[0] < 'a' || k[0] > 'z' || strings.ContainsAny(k, "_- ") {
				t.Errorf("key %q is not lowerCamelCase", k)
			}
		}
	}
	// The unpooled management NIC has every key too, empty.
	for _, n := range l.NICs {
		if len(n) != len(l.NICs[0]) {
			t.Errorf("NIC %v has %d keys, NIC %v has %d: every key must always be present", n["address"], len(n), l.NICs[0]["address"], len(l.NICs[0]))
		}
	}
}
