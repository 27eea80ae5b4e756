package nvcaps

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// writeCaps writes capability files under root's procfs tree; files maps
// a path relative to driver/nvidia/capabilities to its content.
func writeCaps(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(root, capsDir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o444); err != nil {
			t.Fatal(err)
		}
	}
}

// capFile is a capability file as the driver writes it.
func capFile(minor string) string {
	return "DeviceFileMinor: " + minor + "\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
}

func TestNodePath(t *testing.T) {
	if got := NodePath(12); got != "/dev/nvidia-caps/nvidia-cap12" {
		t.Errorf("NodePath(12) = %q", got)
	}
}

func TestParseMinor(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    int
		wantErr string
	}{
		{name: "driver format", content: capFile("21"), want: 21},
		{name: "minor line only, no newline", content: "DeviceFileMinor: 0", want: 0},
		{name: "spaces around", content: "DeviceFileMode: 292\n  DeviceFileMinor :  7  \n", want: 7},
		{name: "empty", content: "", wantErr: "no DeviceFileMinor line"},
		{name: "no minor line", content: "DeviceFileMode: 292\n", wantErr: "no DeviceFileMinor line"},
		{name: "not a number", content: capFile("abc"), wantErr: `"abc" is not a minor number`},
		{name: "empty value", content: "DeviceFileMinor:\n", wantErr: `"" is not a minor number`},
		{name: "negative", content: capFile("-1"), wantErr: "not a minor number"},
		{name: "twice", content: capFile("1") + capFile("2"), wantErr: "more than one"},
		{name: "other key with the prefix", content: "DeviceFileMinorX: 3\n", wantErr: "no DeviceFileMinor line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMinor([]byte(tt.content))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseMinor = %d, %v; want an error with %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("parseMinor = %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

func TestGlobal(t *testing.T) {
	root := t.TempDir()
	writeCaps(t, root, map[string]string{"mig/config": capFile("1"), "mig/monitor": capFile("2")})
	config, monitor, err := Global(root)
	if err != nil || config != 1 || monitor != 2 {
		t.Errorf("Global = %d, %d, %v; want 1, 2", config, monitor, err)
	}
}

func TestGlobalErrors(t *testing.T) {
	tests := []struct {
		name     string
		files    map[string]string
		wantFile string
		notExist bool
	}{
		{name: "no MIG capabilities", files: map[string]string{}, wantFile: "mig/config", notExist: true},
		{name: "monitor missing", files: map[string]string{"mig/config": capFile("1")}, wantFile: "mig/monitor", notExist: true},
		{name: "config malformed", files: map[string]string{"mig/config": "garbage\n", "mig/monitor": capFile("2")}, wantFile: "mig/config"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			writeCaps(t, root, tt.files)
			_, _, err := Global(root)
			if err == nil || !strings.Contains(err.Error(), filepath.Join(root, capsDir, tt.wantFile)) {
				t.Fatalf("Global error %v, want one naming %s", err, tt.wantFile)
			}
			if errors.Is(err, fs.ErrNotExist) != tt.notExist {
				t.Errorf("error %v: errors.Is(fs.ErrNotExist) = %t, want %t", err, !tt.notExist, tt.notExist)
			}
		})
	}
}

// gpus is two GPUs with minors 0 and 3, the second with three MIG devices.
func gpus() []nvml.GPU {
	return []nvml.GPU{
		{Index: 0, UUID: "GPU-whole", Minor: 0},
		{Index: 1, UUID: "GPU-mig", Minor: 3, MIGEnabled: true, MIG: []nvml.MIGDevice{
			{UUID: "MIG-a", Index: 0, GPUInstance: 1, ComputeInstance: 0, Profile: "1c.3g.40gb"},
			{UUID: "MIG-b", Index: 1, GPUInstance: 1, ComputeInstance: 1, Profile: "2c.3g.40gb"},
			{UUID: "MIG-c", Index: 2, GPUInstance: 7, ComputeInstance: 0, Profile: "1g.10gb"},
		}},
	}
}

// driverCaps is the procfs the driver would show for gpus().
func driverCaps() map[string]string {
	return map[string]string{
		"mig/config":                    capFile("1"),
		"mig/monitor":                   capFile("2"),
		"gpu3/mig/gi1/access":           capFile("30"),
		"gpu3/mig/gi1/ci0/access":       capFile("31"),
		"gpu3/mig/gi1/ci1/access":       capFile("32"),
		"gpu3/mig/gi7/access":           capFile("84"),
		"gpu3/mig/gi7/ci0/access":       capFile("85"),
		"gpu0/mig/gi1/access":           capFile("3"), // another GPU's caps are not taken
		"gpu0/mig/gi1/ci0/access":       capFile("4"),
		"gpu3/mig/gi2/access":           capFile("39"),
		"gpu3/mig/gi2/ci0/access":       capFile("40"),
		"gpu3/mig/gi1/ci2/access":       capFile("33"),
		"gpu3/mig/gi7/ci0/unrelated":    "whatever",
		"gpu3/mig/gi7/ci0/access.extra": capFile("99"),
	}
}

func TestAddMIG(t *testing.T) {
	root := t.TempDir()
	writeCaps(t, root, driverCaps())
	in := gpus()
	var buf bytes.Buffer
	got := AddMIG(root, in, slog.New(slog.NewTextHandler(&buf, nil)))

	want := gpus()
	want[1].MIG[0].CapMinors = []int{30, 31}
	want[1].MIG[1].CapMinors = []int{30, 32}
	want[1].MIG[2].CapMinors = []int{84, 85}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("AddMIG =\n%+v\nwant\n%+v", got, want)
	}
	if !reflect.DeepEqual(in, gpus()) {
		t.Errorf("AddMIG changed its input: %+v", in)
	}
	if buf.Len() != 0 {
		t.Errorf("unexpected log:\n%s", buf.String())
	}
}

// TestAddMIGDropsUnreadable: a MIG device whose GPU or compute instance
// capability is missing or malformed is dropped with one error naming the
// file; the others keep theirs.
func TestAddMIGDropsUnreadable(t *testing.T) {
	tests := []struct {
		name    string
		change  map[string]string // "" removes the file
		dropped []string          // MIG UUIDs left out
		file    string            // the file the log names
		reason  string
	}{
		{name: "compute instance capability missing", change: map[string]string{"gpu3/mig/gi1/ci1/access": ""},
			dropped: []string{"MIG-b"}, file: "gpu3/mig/gi1/ci1/access", reason: "no such file"},
		{name: "GPU instance capability missing drops its compute instances", change: map[string]string{"gpu3/mig/gi1/access": ""},
			dropped: []string{"MIG-a", "MIG-b"}, file: "gpu3/mig/gi1/access", reason: "no such file"},
		{name: "malformed compute instance capability", change: map[string]string{"gpu3/mig/gi7/ci0/access": "DeviceFileMinor: x\n"},
			dropped: []string{"MIG-c"}, file: "gpu3/mig/gi7/ci0/access", reason: "malformed"},
		{name: "GPU instance capability without its minor", change: map[string]string{"gpu3/mig/gi7/access": "DeviceFileMode: 292\n"},
			dropped: []string{"MIG-c"}, file: "gpu3/mig/gi7/access", reason: "no DeviceFileMinor line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			caps := driverCaps()
			for rel, content := range tt.change {
				if content == "" {
					delete(caps, rel)
				} else {
					caps[rel] = content
				}
			}
			writeCaps(t, root, caps)
			var buf bytes.Buffer
			got := AddMIG(root, gpus(), slog.New(slog.NewTextHandler(&buf, nil)))

			if len(got) != 2 || got[0].UUID != "GPU-whole" || got[1].UUID != "GPU-mig" || !got[1].MIGEnabled {
				t.Fatalf("GPUs = %+v, want both kept", got)
			}
			var kept []string
			for _, m := range got[1].MIG {
				kept = append(kept, m.UUID)
				if len(m.CapMinors) != 2 {
					t.Errorf("%s CapMinors = %v", m.UUID, m.CapMinors)
				}
			}
			for _, u := range []string{"MIG-a", "MIG-b", "MIG-c"} {
				dropped := strings.Contains(strings.Join(tt.dropped, ","), u)
				if strings.Contains(strings.Join(kept, ","), u) == dropped {
					t.Errorf("kept %v, want %v dropped", kept, tt.dropped)
					break
				}
			}
			log := buf.String()
			if n := strings.Count(log, "level=ERROR"); n != len(tt.dropped) {
				t.Errorf("%d errors logged, want one per dropped device:\n%s", n, log)
			}
			if !strings.Contains(log, filepath.Join(root, capsDir, tt.file)) || !strings.Contains(log, tt.reason) || !strings.Contains(log, "mig="+tt.dropped[0]) {
				t.Errorf("log does not name %s, %s and %q:\n%s", tt.file, tt.dropped[0], tt.reason, log)
			}
		})
	}
}

// TestAddMIGNoProcfs: a node whose procfs has no capabilities (the host
// /proc not mounted, an old driver) serves no MIG device, says so per
// device, and keeps every GPU.
func TestAddMIGNoProcfs(t *testing.T) {
	var buf bytes.Buffer
	got := AddMIG(t.TempDir(), gpus(), slog.New(slog.NewTextHandler(&buf, nil)))
	if len(got) != 2 || len(got[1].MIG) != 0 || !got[1].MIGEnabled {
		t.Errorf("AddMIG = %+v, want both GPUs, no MIG devices", got)
	}
	if n := strings.Count(buf.String(), "level=ERROR"); n != 3 {
		t.Errorf("%d errors, want 3:\n%s", n, buf.String())
	}
}

func TestAddMIGNilLogAndNoMIG(t *testing.T) {
	in := []nvml.GPU{{UUID: "GPU-x"}}
	if got := AddMIG(t.TempDir(), in, nil); !reflect.DeepEqual(got, in) {
		t.Errorf("AddMIG = %+v", got)
	}
	if got := AddMIG(t.TempDir(), nil, nil); len(got) != 0 {
		t.Errorf("AddMIG(nil) = %+v", got)
	}
}
