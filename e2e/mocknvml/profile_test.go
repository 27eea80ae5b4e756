package mocknvml

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestLoadProfileShipped(t *testing.T) {
	for _, c := range []struct {
		profile   string
		gpus      int
		switches  int
		gpu       int // a GPU to compare whole
		want      GPU
		numaNodes []int
	}{
		{
			profile: "dgx-h100", gpus: 8, switches: 4, gpu: 3,
			want: GPU{
				Index: 3, UUID: "GPU-5ec84d8d-bc74-2547-70f5-8904dba41ecc", Name: "NVIDIA H100 80GB HBM3",
				BusID: "0000:5d:00.0", Minor: 3, MemoryMiB: 81559, NUMANode: 0,
				Temperature: 33, SlowdownTemp: 90, ShutdownTemp: 92, MaxTemp: 87,
				Architecture: "hopper", ComputeCapability: "9.0", Brand: "nvidia", PCIDeviceID: 0x233010de,
				NVLinks: links("nvs0*5", "nvs1*4", "nvs2*4", "nvs3*5"),
			},
			numaNodes: []int{0, 0, 0, 0, 1, 1, 1, 1},
		},
		{
			profile: "pcie-4gpu", gpus: 4, switches: 0, gpu: 2,
			want: GPU{
				Index: 2, UUID: "GPU-d6ba2b0a-ee0c-a923-7328-81584d8c4fa2", Name: "NVIDIA L40S",
				BusID: "0000:ce:00.0", Minor: 2, MemoryMiB: 46068, NUMANode: 1,
				Temperature: 30, SlowdownTemp: 95, ShutdownTemp: 98, MaxTemp: 88,
				Architecture: "ada", ComputeCapability: "8.9", Brand: "nvidia", PCIDeviceID: 0x26b910de,
			},
			numaNodes: []int{0, 0, 1, 1},
		},
		{
			profile: "hgx-16", gpus: 16, switches: 8, gpu: 12,
			want: GPU{
				Index: 12, UUID: "GPU-a65e19cb-ae53-0282-bd36-cb9d21f6be6a", Name: "NVIDIA H100 80GB HBM3",
				BusID: "0000:cf:00.0", Minor: 12, MemoryMiB: 81559, NUMANode: 1,
				Temperature: 33, SlowdownTemp: 90, ShutdownTemp: 92, MaxTemp: 87,
				Architecture: "hopper", ComputeCapability: "9.0", Brand: "nvidia", PCIDeviceID: 0x233010de,
				NVLinks: links("b0*5", "b1*4", "b2*4", "b3*5"),
			},
			numaNodes: []int{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
		},
	} {
		t.Run(c.profile, func(t *testing.T) {
			p, err := LoadProfile(profilePath(c.profile))
			if err != nil {
				t.Fatal(err)
			}
			if p.Name != c.profile || len(p.GPUs) != c.gpus || len(p.NVSwitches) != c.switches {
				t.Fatalf("profile %q has %d GPUs and %d switches, want %q with %d and %d",
					p.Name, len(p.GPUs), len(p.NVSwitches), c.profile, c.gpus, c.switches)
			}
			if p.DriverVersion != "550.54.15" || p.NVMLVersion != "12.550.54.15" || p.CUDADriverVersion != 12040 {
				t.Errorf("versions = %q %q %d", p.DriverVersion, p.NVMLVersion, p.CUDADriverVersion)
			}
			if got := p.GPUs[c.gpu]; !reflect.DeepEqual(got, c.want) {
				t.Errorf("GPU %d:\n got %+v\nwant %+v", c.gpu, got, c.want)
			}
			for i, g := range p.GPUs {
				if g.Index != i || g.Minor != i || g.NUMANode != c.numaNodes[i] {
					t.Errorf("GPU %d: index %d minor %d NUMA %d, want NUMA %d", i, g.Index, g.Minor, g.NUMANode, c.numaNodes[i])
				}
			}
		})
	}
}

// links expands "end*count" items the way a profile's nvlink key does.
func links(items ...string) []string {
	var out []string
	for _, it := range items {
		end, n, _ := strings.Cut(it, "*")
		for range int(n[0] - '0') {
			out = append(out, end)
		}
	}
	return out
}

func writeProfile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.profile")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadProfileForms(t *testing.T) {
	p, err := LoadProfile(writeProfile(t, `
nvswitch s0 5:0.0          # short forms are fine
defaults name="Mock GPU X" memory=1024 nvlink=s0*2
gpu 0 uuid=GPU-0 bus=18:00.0 minor=4 numa=1
gpu 1 uuid=GPU-1 bus=00000000:2A:00.1 minor=5 nvlink=gpu0*3,s0 throttle=0X48
defaults memory=2048
gpu 2 uuid=GPU-2 bus=0001:3a:1f.7 minor=6 "name=Quoted Whole Word" mig=on unsupported=remap,temp,,remap
pcie single 0-1,2
pcie node same-numa
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []GPU{
		{Index: 0, UUID: "GPU-0", Name: "Mock GPU X", BusID: "0000:18:00.0", Minor: 4, MemoryMiB: 1024, NUMANode: 1, NVLinks: []string{"s0", "s0"}},
		{Index: 1, UUID: "GPU-1", Name: "Mock GPU X", BusID: "0000:2a:00.1", Minor: 5, MemoryMiB: 1024, NUMANode: -1, Throttle: 0x48, NVLinks: []string{"gpu0", "gpu0", "gpu0", "s0"}},
		{Index: 2, UUID: "GPU-2", Name: "Quoted Whole Word", BusID: "0001:3a:1f.7", Minor: 6, MemoryMiB: 2048, NUMANode: -1, NVLinks: []string{"s0", "s0"},
			MIG: "on", Unsupported: []string{"temp", "remap"}},
	}
	if !reflect.DeepEqual(p.GPUs, want) {
		t.Errorf("GPUs:\n got %+v\nwant %+v", p.GPUs, want)
	}
	if want := []NVSwitch{{Name: "s0", BusID: "0000:05:00.0"}}; !reflect.DeepEqual(p.NVSwitches, want) {
		t.Errorf("NVSwitches = %+v, want %+v", p.NVSwitches, want)
	}
	if want := []PCIeRule{{Level: "single", GPUs: []int{0, 1, 2}}, {Level: "node", SameNUMA: true}}; !reflect.DeepEqual(p.PCIe, want) {
		t.Errorf("PCIe = %+v, want %+v", p.PCIe, want)
	}
}

// badProfiles are profiles both parsers must refuse, with what the Go
// error says. TestLibraryRejectsBadProfiles feeds them to the C parser.
var badProfiles = []struct {
	name, text, reason string
}{
	{"unknown keyword", "gpus 8\n", "unknown keyword gpus"},
	{"unknown key", "gpu 0 uuid=GPU-0 bus=1:0.0 minor=0 colour=green\n", "unknown key colour"},
	{"missing identity", "gpu 0 uuid=GPU-0 bus=1:0.0\n", "uuid, bus and minor are required"},
	{"identity in defaults", "defaults minor=0\n", "minor belongs on each gpu line"},
	{"GPUs out of order", "gpu 1 uuid=GPU-1 bus=1:0.0 minor=1\n", "expected gpu 0"},
	{"uuid without GPU- prefix", "gpu 0 uuid=0123 bus=1:0.0 minor=0\n", "does not start with GPU-"},
	{"duplicate uuid", "gpu 0 uuid=GPU-0 bus=1:0.0 minor=0\ngpu 1 uuid=GPU-0 bus=2:0.0 minor=1\n", "uuid GPU-0 is also gpu 0's"},
	{"duplicate bus", "gpu 0 uuid=GPU-0 bus=1:0.0 minor=0\ngpu 1 uuid=GPU-1 bus=0000:01:00.0 minor=1\n", "bus is also gpu 0's"},
	{"duplicate minor", "gpu 0 uuid=GPU-0 bus=1:0.0 minor=0\ngpu 1 uuid=GPU-1 bus=2:0.0 minor=0\n", "minor 0 is also gpu 0's"},
	{"bus id with a 0x", "gpu 0 uuid=GPU-0 bus=0x18:00.0 minor=0\n", "not a PCI address"},
	{"bus id without function", "gpu 0 uuid=GPU-0 bus=0000:18:00 minor=0\n", "not a PCI address"},
	{"device past 1f", "gpu 0 uuid=GPU-0 bus=18:20.0 minor=0\n", "not a PCI address"},
	{"undeclared switch", "gpu 0 uuid=GPU-0 bus=1:0.0 minor=0 nvlink=sw9*2\n", "sw9 is neither an nvswitch"},
	{"link to a missing GPU", "gpu 0 uuid=GPU-0 bus=1:0.0 minor=0 nvlink=gpu1\n", "nvlink to gpu1, but there are 1 GPUs"},
	{"too many links", "nvswitch s 9:0.0\ngpu 0 uuid=GPU-0 bus=1:0.0 minor=0 nvlink=s*30,s*7\n", "more than 36 links"},
	{"zero link count", "nvswitch s 9:0.0\ngpu 0 uuid=GPU-0 bus=1:0.0 minor=0 nvlink=s*0\n", "count must be 1 to 36"},
	{"empty link list", "gpu 0 uuid=GPU-0 bus=1:0.0 minor=0 nvlink=,\n", "nvlink: empty list"},
	{"switch named like a GPU", "nvswitch gpu9 9:0.0\n", "kept for GPU links"},
	{"unknown PCIe level", "pcie pix 0 1\n", "level pix is not one of"},
	{"rule past the last GPU", "gpu 0 uuid=GPU-0 bus=1:0.0 minor=0\npcie single 0 1\n", "beyond the 1 GPUs"},
	{"backwards range", "pcie single 3-1\n", "not a GPU range"},
	{"unterminated quote", "defaults name=\"H100\n", "unterminated quote"},
	{"hot GPU", "defaults temp=451\n", "not a temperature"},
	{"bad cc", "defaults cc=9\n", "not major.minor"},
	{"unknown arch", "defaults arch=fermi\n", "arch fermi is not one of"},
	{"cuda with words", "cuda 12 4\n", "usage: cuda"},
	{"mig neither on nor off", "defaults mig=yes\n", "mig yes is not on or off"},
	{"unknown unsupported signal", "defaults unsupported=temp,power\n", "power is not one of temp throttle recovery remap"},
	{"empty unsupported list", "defaults unsupported=,\n", "unsupported: empty list"},
	{"mig before its gpu", migGPU0 + "mig 1 " + mig1g + "\n", "mig 1: no gpu 1 above this line"},
	{"mig on a MIG-off gpu", "gpu 0 uuid=GPU-0 bus=1:0.0 minor=0 mig=off memory=81559\nmig 0 " + mig1g + "\n", "gpu 0 does not have mig=on"},
	{"mig on a gpu without MIG", "gpu 0 uuid=GPU-0 bus=1:0.0 minor=0\nmig 0 " + mig1g + "\n", "gpu 0 does not have mig=on"},
	{"mig without a gpu index", migGPU0 + "mig gi=1\n", "usage: mig <gpu index>"},
	{"mig key missing", migGPU0 + "mig 0 gi=7 ci=0 profile=1g.10gb giprofile=0 slices=1 cislices=1 memory=9856 uuid=MIG-a\n", "sms and uuid are required"},
	{"mig unknown key", migGPU0 + "mig 0 " + mig1g + " colour=green\n", "mig: unknown key colour"},
	{"mig uuid without MIG- prefix", migGPU0 + "mig 0 gi=7 ci=0 profile=1g.10gb giprofile=0 slices=1 cislices=1 memory=9856 sms=16 uuid=GPU-a\n", "uuid GPU-a does not start with MIG-"},
	{"mig gi past 14", migGPU0 + "mig 0 gi=15 ci=0 profile=1g.10gb giprofile=0 slices=1 cislices=1 memory=9856 sms=16 uuid=MIG-a\n", "gi 15 is not a GPU instance id from 0 to 14"},
	{"mig ci past 7", migGPU0 + "mig 0 gi=7 ci=8 profile=1g.10gb giprofile=0 slices=1 cislices=1 memory=9856 sms=16 uuid=MIG-a\n", "ci 8 is not a compute instance id from 0 to 7"},
	{"mig unknown GI profile", migGPU0 + "mig 0 gi=7 ci=0 profile=1g.10gb giprofile=18 slices=1 cislices=1 memory=9856 sms=16 uuid=MIG-a\n", "giprofile 18 is not an NVML GPU instance profile index the mock offers"},
	{"mig GI profile no mock GPU offers", migGPU0 + "mig 0 gi=7 ci=0 profile=1g.10gb+gfx giprofile=10 slices=1 cislices=1 memory=9856 sms=16 uuid=MIG-a\n", "giprofile 10 is not an NVML GPU instance profile index the mock offers"},
	{"mig slices not its GI profile's", migGPU0 + "mig 0 gi=7 ci=0 profile=2g.20gb+me giprofile=7 slices=2 cislices=2 memory=20096 sms=32 uuid=MIG-a\n", "giprofile 7 has 1 slices, not 2"},
	{"mig zero slices", migGPU0 + "mig 0 gi=7 ci=0 profile=1g.10gb giprofile=0 slices=0 cislices=1 memory=9856 sms=16 uuid=MIG-a\n", "slices 0 is not a slice count from 1 to 7"},
	{"mig more CI slices than GI slices", migGPU0 + "mig 0 gi=7 ci=0 profile=1g.10gb giprofile=0 slices=1 cislices=2 memory=9856 sms=16 uuid=MIG-a\n", "cislices 2 is more than slices 1"},
	{"mig memory past the GPU's", migGPU0 + "mig 0 gi=7 ci=0 profile=1g.10gb giprofile=0 slices=1 cislices=1 memory=90000 sms=16 uuid=MIG-a\n", "memory 90000 MiB is more than the GPU's 81559 MiB"},
	{"mig zero SMs", migGPU0 + "mig 0 gi=7 ci=0 profile=1g.10gb giprofile=0 slices=1 cislices=1 memory=9856 sms=0 uuid=MIG-a\n", "sms 0 is not a multiprocessor count"},
	{"mig gi and ci twice", migGPU0 + "mig 0 " + mig1g + "\nmig 0 gi=7 ci=0 profile=1g.10gb giprofile=0 slices=1 cislices=1 memory=9856 sms=16 uuid=MIG-b\n", "gi 7 ci 0 is declared twice"},
	{"mig uuid twice", migGPU0 + "mig 0 " + mig1g + "\nmig 0 gi=8 ci=0 profile=1g.10gb giprofile=0 slices=1 cislices=1 memory=9856 sms=16 uuid=MIG-a\n", "uuid MIG-a is also gpu 0's MIG device 0"},
	{"mig GPU instance described two ways", migGPU0 + "mig 0 gi=1 ci=0 profile=1c.3g.40gb giprofile=2 slices=3 cislices=1 memory=40192 sms=16 uuid=MIG-a\nmig 0 gi=1 ci=1 profile=1c.2g.20gb giprofile=1 slices=2 cislices=1 memory=20096 sms=16 uuid=MIG-b\n", "gi 1 differs from its earlier line"},
	{"mig compute instances overflow their GPU instance", migGPU0 + "mig 0 gi=1 ci=0 profile=2c.3g.40gb giprofile=2 slices=3 cislices=2 memory=40192 sms=32 uuid=MIG-a\nmig 0 gi=1 ci=1 profile=2c.3g.40gb giprofile=2 slices=3 cislices=2 memory=40192 sms=32 uuid=MIG-b\n", "the compute instances of gi 1 take more than its 3 slices"},
	{"mig GPU instances overflow the GPU", migGPU0 + "mig 0 gi=0 ci=0 profile=7g.80gb giprofile=4 slices=7 cislices=7 memory=80768 sms=132 uuid=MIG-z\nmig 0 " + mig1g + "\n", "its GPU instances take more than 7 slices"},
	{"mig gi not an id of its profile", migGPU0 + "mig 0 gi=3 ci=0 profile=1g.10gb giprofile=0 slices=1 cislices=1 memory=9856 sms=16 uuid=MIG-a\n", "gi 3 is not an id a giprofile 0 GPU instance has (7 to 13)"},
	{"mig 2g at the last quarter", migGPU0 + "mig 0 gi=6 ci=0 profile=2g.20gb giprofile=1 slices=2 cislices=2 memory=20096 sms=32 uuid=MIG-a\n", "gi 6 is not an id a giprofile 1 GPU instance has (3 to 5)"},
	{"mig GPU instances overlap", migGPU0 + "mig 0 gi=1 ci=0 profile=3g.40gb giprofile=2 slices=3 cislices=3 memory=40192 sms=60 uuid=MIG-a\nmig 0 gi=4 ci=0 profile=2g.20gb giprofile=1 slices=2 cislices=2 memory=20096 sms=32 uuid=MIG-b\n", "gi 4 and gi 1 overlap in memory"},
	{"mig two media-extension instances", migGPU0 + "mig 0 gi=7 ci=0 profile=1g.10gb+me giprofile=7 slices=1 cislices=1 memory=9856 sms=16 uuid=MIG-a\nmig 0 gi=8 ci=0 profile=1g.10gb+me giprofile=7 slices=1 cislices=1 memory=9856 sms=16 uuid=MIG-b\n", "more than 1 GPU instances of giprofile 7"},
}

// migGPU0 is a gpu line with MIG on for the mig cases of badProfiles, and
// mig1g the keys of a 1g.10gb MIG device on it.
const (
	migGPU0 = "gpu 0 uuid=GPU-0 bus=1:0.0 minor=0 mig=on memory=81559\n"
	mig1g   = "gi=7 ci=0 profile=1g.10gb giprofile=0 slices=1 cislices=1 memory=9856 sms=16 uuid=MIG-a"
)

func TestLoadProfileRejects(t *testing.T) {
	for _, c := range badProfiles {
		t.Run(c.name, func(t *testing.T) {
			path := writeProfile(t, c.text)
			_, err := LoadProfile(path)
			if err == nil || !strings.Contains(err.Error(), c.reason) || !strings.HasPrefix(err.Error(), path+":") {
				t.Errorf("LoadProfile = %v, want an error at %s saying %q", err, path, c.reason)
			}
		})
	}
}

func TestLibraryRejectsBadProfiles(t *testing.T) {
	dir := t.TempDir()
	out := runChild(t, "TestChildRejects", "MOCKNVML_TEST_DIR="+dir)
	// The library says why on stderr, in the Go parser's words: "path:line: ...",
	// or "path: ..." for what only the whole file shows.
	for _, c := range badProfiles {
		path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
		if !regexp.MustCompile(`mocknvml: ` + regexp.QuoteMeta(path) + `(:\d+)?: .*` + regexp.QuoteMeta(c.reason)).MatchString(out) {
			t.Errorf("case %q: the library did not report %q at %s", c.name, c.reason, path)
		}
	}
}

// TestChildRejects initialises the library on each bad profile in turn:
// a failed nvmlInit leaves nothing loaded, so the next one reads the
// profile again.
func TestChildRejects(t *testing.T) {
	childOnly(t)
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(envLib)))
	// Without a profile the library plays a node whose driver is not loaded.
	t.Setenv("MOCK_NVML_PROFILE", "")
	if ret := lib.Init(); ret != gonvml.ERROR_DRIVER_NOT_LOADED {
		t.Errorf("Init without a profile = %v, want DRIVER_NOT_LOADED", ret)
	}
	t.Setenv("MOCK_NVML_PROFILE", filepath.Join(os.Getenv("MOCKNVML_TEST_DIR"), "missing.profile"))
	if ret := lib.Init(); ret != gonvml.ERROR_UNKNOWN {
		t.Errorf("Init with a missing profile = %v, want UNKNOWN", ret)
	}
	for i, c := range badProfiles {
		path := filepath.Join(os.Getenv("MOCKNVML_TEST_DIR"), strings.ReplaceAll(c.name, " ", "-"))
		if err := os.WriteFile(path, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Setenv("MOCK_NVML_PROFILE", path)
		if ret := lib.Init(); ret != gonvml.ERROR_UNKNOWN {
			t.Errorf("case %d %q: Init = %v, want UNKNOWN", i, c.name, ret)
			lib.Shutdown()
		}
	}
	// And a good one still loads after them.
	t.Setenv("MOCK_NVML_PROFILE", profilePath("pcie-4gpu"))
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init on pcie-4gpu: %v", ret)
	}
	lib.Shutdown()
}

func TestWriteSysfsAndDev(t *testing.T) {
	p, err := LoadProfile(profilePath("pcie-4gpu"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := p.WriteSysfs(filepath.Join(root, "sys")); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteDev(filepath.Join(root, "dev")); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"sys/bus/pci/devices/0000:4f:00.0/numa_node": "0\n",
		"sys/bus/pci/devices/0000:d1:00.0/numa_node": "1\n",
		"sys/bus/pci/devices/0000:d1:00.0/vendor":    "0x10de\n",
		"sys/bus/pci/devices/0000:d1:00.0/device":    "0x26b9\n",
		"dev/nvidia0":          "",
		"dev/nvidia3":          "",
		"dev/nvidiactl":        "",
		"dev/nvidia-uvm":       "",
		"dev/nvidia-uvm-tools": "",
	} {
		b, err := os.ReadFile(filepath.Join(root, path))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", path, b, err, want)
		}
	}
	// What go-nvlib's nvpci needs (GFD): a resource line per BAR, and a
	// config space header with the IDs and the 3D controller class.
	dev := filepath.Join(root, "sys/bus/pci/devices/0000:d1:00.0")
	if b, err := os.ReadFile(filepath.Join(dev, "resource")); err != nil || strings.Count(string(b), "\n") != 13 {
		t.Errorf("resource = %q, %v; want 13 lines", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(dev, "config")); err != nil || len(b) != 256 ||
		string(b[:4]) != "\xde\x10\xb9\x26" || b[0x0a] != 0x02 || b[0x0b] != 0x03 {
		t.Errorf("config = % x, %v; want 256 bytes, 10de:26b9, class 0302", b, err)
	}
}
