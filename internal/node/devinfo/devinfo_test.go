package devinfo

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
)

// The names Multus looks for: the spec's section 4.1 and what the
// network-attachment-definition-client's SaveDeviceInfoForDP writes.
func TestFileName(t *testing.T) {
	for _, c := range []struct{ resource, id, want string }{
		{"example.com/rdma_numa0", "0000:18:00.0", "example.com-rdma_numa0-0000:18:00.0-device.json"},
		{"nvidia.com/rdma-ib", "0000:c1:00.1", "nvidia.com-rdma-ib-0000:c1:00.1-device.json"},
		{"plain", "a/b", "plain-a-b-device.json"},
	} {
		t.Run(c.want, func(t *testing.T) {
			if got := FileName(c.resource, c.id); got != c.want {
				t.Errorf("FileName(%q, %q) = %q, want %q", c.resource, c.id, got, c.want)
			}
		})
	}
}

// checkSpec applies the Device Information Specification v1.1.0's rules
// (sections 3.1 to 3.1.3) to a file's bytes: a JSON object whose "type"
// is one of the spec's and "version" MAJOR.MINOR.PATCH, with the map that
// "type" names; a "pci" map holds only the spec's string keys, a
// "pci-address" among them, and addresses in dddd:BB:DD.f form.
func checkSpec(data []byte) error {
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("not a JSON object: %w", err)
	}
	for k := range doc {
		if !slices.Contains([]string{"type", "version", "pci", "vdpa", "vhost-user", "memif"}, k) {
			return fmt.Errorf("key %q is not in the spec", k)
		}
	}
	typ, ok := doc["type"].(string)
	if !ok || !slices.Contains([]string{"pci", "vdpa", "vhost-user", "memif"}, typ) {
		return fmt.Errorf(`"type" %v: want one of pci, vdpa, vhost-user, memif`, doc["type"])
	}
	if v, ok := doc["version"].(string); !ok || !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(v) {
		return fmt.Errorf(`"version" %v: want MAJOR.MINOR.PATCH`, doc["version"])
	}
	m, ok := doc[typ].(map[string]any)
	if !ok {
		return fmt.Errorf(`"type" is %q but %q is %v, want a map`, typ, typ, doc[typ])
	}
	if typ != "pci" {
		return nil
	}
	addr := regexp.MustCompile(`^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)
	for k, v := range m {
		s, isString := v.(string)
		switch {
		case !slices.Contains([]string{"pci-address", "vhost-net", "rdma-device", "pf-pci-address", "representor-device"}, k):
			return fmt.Errorf("pci key %q is not in the spec", k)
		case !isString:
			return fmt.Errorf("pci.%s is %T, want a string", k, v)
		case (k == "pci-address" || k == "pf-pci-address") && !addr.MatchString(s):
			return fmt.Errorf("pci.%s %q is not a dddd:BB:DD.f PCI address", k, s)
		}
	}
	if _, ok := m["pci-address"]; !ok {
		return fmt.Errorf("pci has no pci-address")
	}
	return nil
}

// The schema check itself refuses what the spec does.
func TestCheckSpecRefuses(t *testing.T) {
	for name, doc := range map[string]string{
		"no type":           `{"version":"1.1.0","pci":{"pci-address":"0000:18:00.0"}}`,
		"unknown type":      `{"type":"usb","version":"1.1.0"}`,
		"bad version":       `{"type":"pci","version":"1.1","pci":{"pci-address":"0000:18:00.0"}}`,
		"pci missing":       `{"type":"pci","version":"1.1.0"}`,
		"no pci-address":    `{"type":"pci","version":"1.1.0","pci":{"rdma-device":"mlx5_0"}}`,
		"short address":     `{"type":"pci","version":"1.1.0","pci":{"pci-address":"18:00.0"}}`,
		"camelCase key":     `{"type":"pci","version":"1.1.0","pci":{"pciAddress":"0000:18:00.0"}}`,
		"extra top key":     `{"type":"pci","version":"1.1.0","owner":"x","pci":{"pci-address":"0000:18:00.0"}}`,
		"non-string value":  `{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:18:00.0","rdma-device":1}}`,
		"bad pf address":    `{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:18:00.2","pf-pci-address":"x"}}`,
		"not a JSON object": `[]`,
	} {
		if checkSpec([]byte(doc)) == nil {
			t.Errorf("%s: %s passed the schema check", name, doc)
		}
	}
}

func TestWriteContent(t *testing.T) {
	for _, c := range []struct {
		name string
		nic  sysfs.NIC
		want string
	}{
		{"RDMA PF", sysfs.NIC{Address: "0000:18:00.0", IBDevices: []string{"mlx5_0"}, RDMADevices: []string{"uverbs0"}},
			`{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:18:00.0","rdma-device":"mlx5_0"}}`},
		{"SR-IOV VF", sysfs.NIC{Address: "0000:18:00.2", PF: "0000:18:00.0", IBDevices: []string{"mlx5_2"}},
			`{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:18:00.2","rdma-device":"mlx5_2","pf-pci-address":"0000:18:00.0"}}`},
		{"vfio-pci, no RDMA", sysfs.NIC{Address: "0000:3b:00.1", Driver: sysfs.DriverVFIO, IOMMUGroup: "42"},
			`{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:3b:00.1"}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Dir{Path: filepath.Join(t.TempDir(), "devinfo", "dp")} // created on write
			p, err := d.Write("example.com/rdma_numa0", c.nic)
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(d.Path, FileName("example.com/rdma_numa0", c.nic.Address)); p != want {
				t.Errorf("wrote %s, want %s", p, want)
			}
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkSpec(data); err != nil {
				t.Errorf("%s breaks the device-info spec: %v\n%s", p, err, data)
			}
			var got, want any
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(c.want), &want); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("wrote %s, want %s", data, c.want)
			}
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o644 {
				t.Errorf("mode %v (%v), want 0644: Multus may run as another user", fi.Mode(), err)
			}
		})
	}
}

// A rewrite replaces the file by rename (a reader holding the old one
// keeps reading it whole), leaves no temporary file, and identical bytes
// are not rewritten at all.
func TestWriteIsAtomic(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	nic := sysfs.NIC{Address: "0000:18:00.0", IBDevices: []string{"mlx5_0"}}
	p, err := d.Write("example.com/rdma_numa0", nic)
	if err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	first, _ := os.Stat(p)

	if _, err := d.Write("example.com/rdma_numa0", nic); err != nil {
		t.Fatal(err)
	}
	if same, _ := os.Stat(p); !os.SameFile(first, same) {
		t.Error("identical content was rewritten")
	}

	nic.IBDevices = []string{"mlx5_4"} // a driver rebind renamed it
	if _, err := d.Write("example.com/rdma_numa0", nic); err != nil {
		t.Fatal(err)
	}
	second, _ := os.Stat(p)
	if os.SameFile(first, second) {
		t.Error("new content was written into the old file, not renamed over it")
	}
	var old Info
	if err := json.NewDecoder(held).Decode(&old); err != nil || old.PCI.RDMADevice != "mlx5_0" {
		t.Errorf("a reader of the old file got %+v, %v", old.PCI, err)
	}
	if data, _ := os.ReadFile(p); checkSpec(data) != nil || !json.Valid(data) {
		t.Errorf("new file %s", data)
	}
	entries, _ := os.ReadDir(d.Path)
	if len(entries) != 1 {
		t.Errorf("directory holds %v, want the one file", entries)
	}
}

func TestWriteFailsOnUnwritableDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (Dir{Path: file}).Write("example.com/rdma_numa0", sysfs.NIC{Address: "0000:18:00.0"}); err == nil {
		t.Error("writing under a regular file succeeded")
	}
}

// Prune removes our stale files and temporary files, and nothing of
// another plugin's, nor of a resource whose name extends ours.
func TestPrune(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	files := []string{
		"example.com-rdma_numa0-0000:18:00.0-device.json",         // kept
		"example.com-rdma_numa0-0000:2a:00.0-device.json",         // stale: not a member
		"example.com-rdma_numa1-0000:9a:00.0-device.json",         // kept
		"example.com-rdma_numa1-0000:18:00.0-device.json",         // stale: another pool's NIC
		".example.com-rdma_numa0-0000:18:00.0-device.json.tmp123", // a crashed write
		"example.com-rdma_numa0-x-0000:18:00.0-device.json",       // resource example.com/rdma_numa0-x: not ours
		"intel.com-sriov_netdevice-0000:18:00.2-device.json",      // another plugin's
		"example.com-rdma_numa0-0000:18:00.0-other.json",          // not a device-info file
		"notes.txt",
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(d.Path, f), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := d.Prune(map[string][]string{
		"example.com/rdma_numa0": {"0000:18:00.0"},
		"example.com/rdma_numa1": {"0000:9a:00.0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range removed {
		names = append(names, filepath.Base(p))
	}
	slices.Sort(names)
	want := []string{files[4], files[1], files[3]}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("removed %v, want %v", names, want)
	}
	for _, f := range files {
		_, err := os.Stat(filepath.Join(d.Path, f))
		if gone := err != nil; gone != slices.Contains(want, f) {
			t.Errorf("%s: gone=%v", f, gone)
		}
	}
	if _, err := (Dir{Path: filepath.Join(d.Path, "missing")}).Prune(map[string][]string{"example.com/rdma_numa0": nil}); err != nil {
		t.Errorf("pruning a missing directory: %v", err)
	}
}

// testdata/c596a2d/rdma_numa0-0000_18_00.0.json is the file the release
// this one follows (commit c596a2d, Dir.Write) wrote for the DGX H100
// fixture's first NIC of example.com/rdma_numa0, stored under a name a Go
// module may hold; oldName is the name it had. This release finds it
// under the same name, leaves its identical bytes alone (no rewrite, no
// second file), and prunes it when the NIC leaves the pool.
func TestFileOfThePreviousRelease(t *testing.T) {
	const resource, oldName = "example.com/rdma_numa0", "example.com-rdma_numa0-0000:18:00.0-device.json"
	old, err := os.ReadFile(filepath.Join("testdata", "c596a2d", "rdma_numa0-0000_18_00.0.json"))
	if err != nil {
		t.Fatal(err)
	}
	d := Dir{Path: t.TempDir()}
	p := filepath.Join(d.Path, oldName)
	if err := os.WriteFile(p, old, 0o644); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(p)
	nic := sysfs.NIC{Address: "0000:18:00.0", IBDevices: []string{"mlx5_0"}, RDMADevices: []string{"uverbs0"}}
	if !d.Exists(resource, nic.Address) {
		t.Fatal("the previous release's file is not found under this release's name")
	}
	if got, err := d.Write(resource, nic); err != nil || got != p {
		t.Fatalf("wrote %s (%v), want %s", got, err, p)
	}
	if after, _ := os.Stat(p); !os.SameFile(before, after) {
		t.Error("the same NIC's file was rewritten: this release's bytes differ from the previous release's")
	}
	if entries, _ := os.ReadDir(d.Path); len(entries) != 1 {
		t.Errorf("directory holds %v, want the one file", entries)
	}
	if removed, err := d.Prune(map[string][]string{resource: {"0000:40:00.0"}}); err != nil || len(removed) != 1 || removed[0] != p {
		t.Errorf("pruning the previous release's file of a NIC gone: %v, %v", removed, err)
	}
}

// A newer release may write more of the spec's keys; this one, rolled
// back, replaces the file whole with what it knows of the NIC (the file is
// derived from sysfs, not kept), under the same name.
func TestFileOfANewerReleaseIsReplaced(t *testing.T) {
	const resource = "example.com/rdma_numa0"
	d := Dir{Path: t.TempDir()}
	p := filepath.Join(d.Path, FileName(resource, "0000:18:00.2"))
	newer := `{"type":"pci","version":"1.2.0","pci":{"pci-address":"0000:18:00.2","rdma-device":"mlx5_2","representor-device":"pf0vf0"}}`
	if err := os.WriteFile(p, []byte(newer), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Write(resource, sysfs.NIC{Address: "0000:18:00.2", PF: "0000:18:00.0", IBDevices: []string{"mlx5_2"}}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(p)
	if err != nil || checkSpec(data) != nil {
		t.Fatalf("%s, %v", data, err)
	}
	var info Info
	if err := json.Unmarshal(data, &info); err != nil || info.Version != Version || info.PCI.PFAddress != "0000:18:00.0" {
		t.Errorf("file holds %s", data)
	}
	if entries, _ := os.ReadDir(d.Path); len(entries) != 1 {
		t.Errorf("directory holds %v, want the one file", entries)
	}
}

// A NIC behind VMD has a five-digit PCI domain: its file is ours and is
// pruned like any other.
func TestPruneWideDomain(t *testing.T) {
	const resource = "example.com/rdma"
	d := Dir{Path: t.TempDir()}
	p, err := d.Write(resource, sysfs.NIC{Address: "10000:01:00.0"})
	if err != nil {
		t.Fatal(err)
	}
	if removed, err := d.Prune(map[string][]string{resource: {"10000:01:00.1"}}); err != nil || !slices.Equal(removed, []string{p}) {
		t.Errorf("removed %v (%v), want %s", removed, err, p)
	}
}
