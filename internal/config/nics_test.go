package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestLoadExampleNICs(t *testing.T) {
	c, err := Load("testdata/example-nics.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	yes := true
	want := []NICResource{
		{Name: "example.com/rdma_numa0", Selectors: NICSelectors{Vendors: []string{"15b3"}, Devices: []string{"1021"}, Drivers: []string{"mlx5_core"}, RDMA: &yes, NUMANodes: []int{0}}},
		{Name: "example.com/rdma_numa1", Selectors: NICSelectors{Vendors: []string{"15b3"}, Devices: []string{"1021"}, Drivers: []string{"mlx5_core"}, RDMA: &yes, NUMANodes: []int{1}}},
	}
	if !reflect.DeepEqual(c.NICResources, want) {
		t.Errorf("nicResources = %+v\nwant %+v", c.NICResources, want)
	}
	if c.DeviceIDStrategy != "uuid" {
		t.Errorf("a NIC-only file changed other settings: %+v", c)
	}
}

func TestLoadEverySelector(t *testing.T) {
	c, err := Load(writeFile(t, `
nicResources:
  - name: example.com/all
    selectors:
      vendors: ["15B3", "8086"]
      devices: ["1021"]
      drivers: ["mlx5_core", "vfio-pci"]
      pciAddresses: ["0000:18:00.0", "0000:AF:00.1"]
      netdevs: ["ibp24s0"]
      numaNodes: [0, 1]
      rdma: false
      linkTypes: ["ether", "infiniband"]
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	s := c.NICResources[0].Selectors
	if len(s.Vendors) != 2 || len(s.PCIAddresses) != 2 || s.RDMA == nil || *s.RDMA || len(s.LinkTypes) != 2 || len(s.NUMANodes) != 2 {
		t.Errorf("selectors = %+v", s)
	}
}

func TestNICResourceErrors(t *testing.T) {
	const good = "  - name: example.com/rdma_numa0\n    selectors: {vendors: [\"15b3\"]}\n"
	tests := []struct {
		name string
		body string
		want []string
	}{
		{
			name: "short vendor ID",
			body: good + "  - name: example.com/rdma_numa1\n    selectors: {vendors: [\"15b\"]}\n",
			want: []string{`config: nicResources[1].selectors.vendors[0]: "15b" is not a 4-digit hex PCI vendor ID (example: "15b3")`},
		},
		{
			name: "vendor ID with 0x",
			body: "  - name: example.com/a\n    selectors: {vendors: [\"0x15b3\"]}\n",
			want: []string{`nicResources[0].selectors.vendors[0]: "0x15b3"`},
		},
		{
			name: "non-hex device ID",
			body: "  - name: example.com/a\n    selectors: {devices: [\"10zz\"]}\n",
			want: []string{`nicResources[0].selectors.devices[0]: "10zz" is not a 4-digit hex PCI device ID (example: "1021")`},
		},
		{
			name: "unquoted device ID",
			body: "  - name: example.com/a\n    selectors: {devices: [1021]}\n",
			want: []string{"nicResources[0].selectors.devices", "quote hex IDs"},
		},
		{
			name: "bad driver",
			body: "  - name: example.com/a\n    selectors: {drivers: [\"mlx5 core\"]}\n",
			want: []string{`nicResources[0].selectors.drivers[0]: "mlx5 core"`},
		},
		{
			name: "bad PCI address",
			body: "  - name: example.com/a\n    selectors: {pciAddresses: [\"18:00.0\"]}\n",
			want: []string{`nicResources[0].selectors.pciAddresses[0]: "18:00.0"`, `"0000:18:00.0"`},
		},
		{
			name: "bad netdev",
			body: "  - name: example.com/a\n    selectors: {netdevs: [\"a-name-far-too-long-for-linux\"]}\n",
			want: []string{"nicResources[0].selectors.netdevs[0]", "15 characters"},
		},
		{
			name: "negative NUMA node",
			body: "  - name: example.com/a\n    selectors: {numaNodes: [-1]}\n",
			want: []string{"nicResources[0].selectors.numaNodes[0]: -1"},
		},
		{
			name: "NUMA node not a number",
			body: "  - name: example.com/a\n    selectors: {numaNodes: [zero]}\n",
			want: []string{"nicResources[0].selectors.numaNodes: got a string, want a whole number"},
		},
		{
			name: "bad link type",
			body: "  - name: example.com/a\n    selectors: {linkTypes: [\"ethernet\"]}\n",
			want: []string{`nicResources[0].selectors.linkTypes[0]: "ethernet" is not allowed; use one of ether, infiniband`},
		},
		{
			name: "rdma not a bool",
			body: "  - name: example.com/a\n    selectors: {rdma: sometimes}\n",
			want: []string{"nicResources[0].selectors.rdma: got a string, want true or false"},
		},
		{
			name: "no selectors",
			body: "  - name: example.com/a\n",
			want: []string{"nicResources[0].selectors: no selector is set", "vendors, devices"},
		},
		{
			name: "misspelt selector",
			body: good + "  - name: example.com/b\n    selectors: {vendor: [\"15b3\"]}\n",
			want: []string{`nicResources[1].selectors: unknown key "vendor"; known keys: vendors, devices, drivers, pciAddresses, netdevs, numaNodes, rdma, linkTypes`},
		},
		{
			name: "misspelt pool key",
			body: "  - name: example.com/a\n    selector: {vendors: [\"15b3\"]}\n",
			want: []string{`nicResources[0]: unknown key "selector"; known keys: name, selectors`},
		},
		{
			name: "name without domain",
			body: "  - name: rdma_numa0\n    selectors: {vendors: [\"15b3\"]}\n",
			want: []string{`nicResources[0].name: "rdma_numa0" is not a full extended-resource name`, "example.com/rdma_numa0"},
		},
		{
			name: "name in kubernetes.io",
			body: "  - name: kubernetes.io/nic\n    selectors: {vendors: [\"15b3\"]}\n",
			want: []string{"nicResources[0].name", "reserved"},
		},
		{
			name: "upper-case domain",
			body: "  - name: Example.com/nic\n    selectors: {vendors: [\"15b3\"]}\n",
			want: []string{"nicResources[0].name", "DNS name"},
		},
		{
			name: "bad short name",
			body: "  - name: example.com/-nic\n    selectors: {vendors: [\"15b3\"]}\n",
			want: []string{"nicResources[0].name", `"-nic"`},
		},
		{
			name: "the GPU resource",
			body: "  - name: nvidia.com/gpu\n    selectors: {vendors: [\"15b3\"]}\n",
			want: []string{"nicResources[0].name", "served by the plugin itself"},
		},
		{
			name: "duplicate name",
			body: good + good,
			want: []string{`nicResources[1].name: "example.com/rdma_numa0" is already the name of nicResources[0]`},
		},
		{
			name: "not a list of pools",
			body: "  - just-a-string\n",
			want: []string{"nicResources[0]: want a pool"},
		},
		{
			name: "unknown link check",
			body: "  - name: example.com/a\n    linkCheck: carrier\n    selectors: {vendors: [\"15b3\"]}\n",
			want: []string{`config: nicResources[0].linkCheck: "carrier" is not allowed; use one of rdma-port, netdev, off`},
		},
		{
			name: "negative removal grace period",
			body: "  - name: example.com/a\n    removalGracePeriod: -1m\n    selectors: {vendors: [\"15b3\"]}\n",
			want: []string{"config: nicResources[0].removalGracePeriod: -1m0s must not be negative", "0s"},
		},
		{
			name: "removal grace period without unit",
			body: "  - name: example.com/a\n    removalGracePeriod: 300\n    selectors: {vendors: [\"15b3\"]}\n",
			want: []string{"removalGracePeriod", `"300s"`},
		},
		{
			name: "pfOnly and vfOnly together",
			body: "  - name: example.com/a\n    selectors: {pfOnly: true, vfOnly: true}\n",
			want: []string{"config: nicResources[0].selectors: pfOnly and vfOnly are both true", "set at most one"},
		},
		{
			name: "pfOnly not a bool",
			body: "  - name: example.com/a\n    selectors: {pfOnly: yes-please}\n",
			want: []string{"nicResources[0].selectors.pfOnly: got a string, want true or false"},
		},
		{
			name: "six-digit PCI domain",
			body: "  - name: example.com/a\n    selectors: {pciAddresses: [\"100000:01:00.0\"]}\n",
			want: []string{`nicResources[0].selectors.pciAddresses[0]: "100000:01:00.0"`, "4- or 5-digit domain"},
		},
		{
			name: "every problem at once",
			body: "  - name: x\n    selectors: {vendors: [\"1\"], devices: [\"2\"]}\n",
			want: []string{"nicResources[0].name", "nicResources[0].selectors.vendors[0]", "nicResources[0].selectors.devices[0]"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(writeFile(t, "nicResources:\n"+tt.body))
			if err == nil {
				err = c.Validate()
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestUnknownTopLevelKeyListsNICResources(t *testing.T) {
	_, err := Load(writeFile(t, "nicResource: []\n"))
	if err == nil || !strings.Contains(err.Error(), "nicResources") {
		t.Fatalf("err = %v, want the known keys to include nicResources", err)
	}
}

func TestNICResourcesNotAList(t *testing.T) {
	_, err := Load(writeFile(t, "nicResources: {name: example.com/a}\n"))
	if err == nil || !strings.Contains(err.Error(), "nicResources: want a list of pools") {
		t.Fatalf("err = %v", err)
	}
	if c, err := Load(writeFile(t, "nicResources:\n")); err != nil || c.NICResources != nil {
		t.Fatalf("empty nicResources = %v, %v", c.NICResources, err)
	}
}

func TestNICResourceNewKeys(t *testing.T) {
	c, err := Load(writeFile(t, `
nicResources:
  - name: example.com/vmd
    linkCheck: netdev
    removalGracePeriod: 30s
    selectors: {pciAddresses: ["10000:01:00.0"], pfOnly: true}
  - name: example.com/vfs
    linkCheck: "off"
    selectors: {vendors: ["15b3"], vfOnly: true}
  - name: example.com/ib
    linkCheck: rdma-port
    removalGracePeriod: 0s
    selectors: {vendors: ["15b3"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	r := c.NICResources
	if r[0].LinkCheck != LinkCheckNetdev || r[0].GracePeriod() != 30*time.Second || !r[0].Selectors.PFOnly || r[0].Selectors.PCIAddresses[0] != "10000:01:00.0" {
		t.Errorf("nicResources[0] = %+v", r[0])
	}
	if r[1].LinkCheck != LinkCheckOff || r[1].GracePeriod() != DefaultRemovalGracePeriod || !r[1].Selectors.VFOnly {
		t.Errorf("nicResources[1] = %+v", r[1])
	}
	if r[2].LinkCheck != LinkCheckRDMAPort || r[2].GracePeriod() != 0 {
		t.Errorf("nicResources[2] = %+v", r[2])
	}
}

// With a cdi-* strategy each pool name is a CDI kind; names the CDI
// library refuses (or, for one character, panics on) are config errors.
func TestNICResourceNamesForCDI(t *testing.T) {
	tests := []struct {
		name       string
		pool       string
		strategies string
		want       []string // substrings; none means valid
	}{
		{name: "one-character class panics the CDI library", pool: "example.com/x", strategies: "cdi-cri",
			want: []string{`config: nicResources[0].name: "example.com/x" cannot be a CDI kind, which deviceListStrategy cdi-cri needs`, "shorter than 2", "rename the pool", "example.com/rdma_numa0"}},
		{name: "class starting with a digit never resolves", pool: "example.com/1g", strategies: "cdi-cri",
			want: []string{`nicResources[0].name: "example.com/1g" cannot be a CDI kind`, "should start with letter", "rename the pool"}},
		{name: "vendor starting with a digit", pool: "1example.com/rdma", strategies: "cdi-annotations",
			want: []string{`nicResources[0].name: "1example.com/rdma" cannot be a CDI kind, which deviceListStrategy cdi-annotations needs`, "invalid vendor"}},
		{name: "too long for the annotation key", pool: "example.com/" + strings.Repeat("a", 40), strategies: "cdi-annotations",
			want: []string{"nicResources[0].name", "too long for deviceListStrategy cdi-annotations", "at most 45 characters"}},
		{name: "long name fine under cdi-cri", pool: "example.com/" + strings.Repeat("a", 40), strategies: "cdi-cri"},
		{name: "one-character class fine under envvar", pool: "example.com/x", strategies: "envvar"},
		{name: "digit class fine under envvar", pool: "example.com/1g", strategies: "envvar"},
		{name: "usual name under both", pool: "example.com/rdma_numa0", strategies: "cdi-cri,cdi-annotations"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(writeFile(t, "deviceListStrategy: ["+tt.strategies+"]\nnicResources:\n  - name: "+tt.pool+"\n    selectors: {vendors: [\"15b3\"]}\n"))
			if err != nil {
				t.Fatal(err)
			}
			err = c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
