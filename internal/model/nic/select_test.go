package nic

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs/sysfstest"
)

// fixture is a materialised host tree and a scanner over it.
type fixture struct {
	root    string
	scanner *sysfs.NICScanner
}

func load(t *testing.T, name string) *fixture {
	t.Helper()
	root := sysfstest.Load(t, name)
	return &fixture{root: root, scanner: sysfs.NewNICScanner(sysfs.NICOptions{
		SysfsRoot: filepath.Join(root, "sys"),
		ProcRoot:  filepath.Join(root, "proc"),
		HostRoot:  root,
	})}
}

func (f *fixture) scan(t *testing.T) []sysfs.NIC {
	t.Helper()
	nics, err := f.scanner.Scan()
	if err != nil {
		t.Fatal(err)
	}
	return nics
}

func (f *fixture) apply(t *testing.T, directives string) { sysfstest.Apply(t, f.root, directives) }

func (f *fixture) devRoot() string { return filepath.Join(f.root, "dev") }

func ptr[T any](v T) *T { return &v }

// selected lists the addresses of the NICs a pool with these selectors
// takes.
func selected(s config.NICSelectors, nics []sysfs.NIC) []string {
	var out []string
	for _, n := range nics {
		if Selects(s, n) {
			out = append(out, n.Address)
		}
	}
	return out
}

func TestEnvName(t *testing.T) {
	for in, want := range map[string]string{
		"example.com/rdma_numa0":  "PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0",
		"nvidia.com/ib-Dev.v2":    "PCIDEVICE_NVIDIA_COM_IB_DEV_V2",
		"intel.com/intel_sriov_1": "PCIDEVICE_INTEL_COM_INTEL_SRIOV_1",
	} {
		if got := EnvName(in); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSelectors(t *testing.T) {
	dgx := load(t, "dgx-h100").scan(t)
	sriov := load(t, "sriov").scan(t)
	vfio := load(t, "vfio").scan(t)
	numa0 := []string{"0000:18:00.0", "0000:40:00.0", "0000:4f:00.0", "0000:5e:00.0"}
	numa1 := []string{"0000:9a:00.0", "0000:c0:00.0", "0000:ce:00.0", "0000:dc:00.0"}
	allCX7 := append(slices.Clone(numa0), numa1...)
	tests := []struct {
		name string
		nics []sysfs.NIC
		sel  config.NICSelectors
		want []string
	}{
		{name: "vendor", nics: dgx, sel: config.NICSelectors{Vendors: []string{"15b3"}}, want: allCX7},
		{name: "vendor in upper case", nics: dgx, sel: config.NICSelectors{Vendors: []string{"15B3"}}, want: allCX7},
		{name: "device", nics: sriov, sel: config.NICSelectors{Devices: []string{"101e"}}, want: []string{"0000:3b:00.2", "0000:3b:00.3"}},
		{name: "driver", nics: vfio, sel: config.NICSelectors{Drivers: []string{"vfio-pci"}}, want: []string{"0000:af:00.0"}},
		{name: "PCI address in any case", nics: dgx, sel: config.NICSelectors{PCIAddresses: []string{"0000:9A:00.0", "0000:18:00.0"}}, want: []string{"0000:18:00.0", "0000:9a:00.0"}},
		{name: "netdev", nics: dgx, sel: config.NICSelectors{Netdevs: []string{"ibp64s0", "ibp220s0"}}, want: []string{"0000:40:00.0", "0000:dc:00.0"}},
		{name: "NUMA node", nics: dgx, sel: config.NICSelectors{Vendors: []string{"15b3"}, NUMANodes: []int{1}}, want: numa1},
		{name: "NUMA node never matches unknown", nics: load(t, "numa-unknown").scan(t), sel: config.NICSelectors{NUMANodes: []int{0}}, want: nil},
		{name: "rdma true", nics: dgx, sel: config.NICSelectors{RDMA: ptr(true)}, want: allCX7},
		{name: "rdma false", nics: vfio, sel: config.NICSelectors{RDMA: ptr(false)}, want: []string{"0000:af:00.0"}},
		{name: "link type infiniband", nics: dgx, sel: config.NICSelectors{LinkTypes: []string{"infiniband"}}, want: allCX7},
		{name: "link type ether", nics: sriov, sel: config.NICSelectors{LinkTypes: []string{"ether"}}, want: []string{"0000:3b:00.2", "0000:3b:00.3"}},
		{name: "all selectors must match", nics: dgx, sel: config.NICSelectors{Vendors: []string{"15b3"}, Drivers: []string{"igb"}}, want: nil},
		{name: "any value of a list matches", nics: vfio, sel: config.NICSelectors{PCIAddresses: []string{"0000:af:00.0", "0000:af:00.1"}}, want: []string{"0000:af:00.0", "0000:af:00.1"}},
		// A PF with VFs enabled is shared with the pods holding its VFs
		// (the SR-IOV network device plugin's rule).
		{name: "PF with VFs left out", nics: sriov, sel: config.NICSelectors{Vendors: []string{"15b3"}}, want: []string{"0000:3b:00.2", "0000:3b:00.3"}},
		{name: "PF with VFs left out of pfOnly", nics: sriov, sel: config.NICSelectors{PFOnly: true}, want: nil},
		{name: "PF with VFs taken when its address is named", nics: sriov, sel: config.NICSelectors{PCIAddresses: []string{"0000:3b:00.0"}}, want: []string{"0000:3b:00.0"}},
		{name: "PF with VFs taken when its netdev is named", nics: sriov, sel: config.NICSelectors{Netdevs: []string{"ens2f0np0"}}, want: []string{"0000:3b:00.0"}},
		{name: "vfOnly", nics: sriov, sel: config.NICSelectors{Vendors: []string{"15b3"}, VFOnly: true}, want: []string{"0000:3b:00.2", "0000:3b:00.3"}},
		{name: "vfOnly takes no PF", nics: dgx, sel: config.NICSelectors{Vendors: []string{"15b3"}, VFOnly: true}, want: nil},
		{name: "pfOnly takes PFs without VFs", nics: dgx, sel: config.NICSelectors{Vendors: []string{"15b3"}, PFOnly: true}, want: allCX7},
		{name: "pfOnly takes no VF", nics: sriov, sel: config.NICSelectors{Devices: []string{"101e"}, PFOnly: true}, want: nil},
		{name: "default-route NIC left out", nics: dgx, sel: config.NICSelectors{Vendors: []string{"8086"}}, want: nil},
		{name: "default-route NIC behind a bond left out", nics: load(t, "numa-unknown").scan(t), sel: config.NICSelectors{Vendors: []string{"15b3"}}, want: []string{"0000:01:00.0"}},
		{name: "default-route NIC taken when named", nics: dgx, sel: config.NICSelectors{PCIAddresses: []string{"0000:03:00.0"}}, want: []string{"0000:03:00.0"}},
		{name: "default-route NIC taken only when named", nics: vfio, sel: config.NICSelectors{Vendors: []string{"8086"}, PCIAddresses: []string{"0000:af:00.0"}}, want: []string{"0000:af:00.0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := selected(tt.sel, tt.nics); !slices.Equal(got, tt.want) {
				t.Errorf("selected %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMatchesIgnoresDefaultRoute(t *testing.T) {
	nics := load(t, "dgx-h100").scan(t)
	var mgmt sysfs.NIC
	for _, n := range nics {
		if n.DefaultRoute {
			mgmt = n
		}
	}
	sel := config.NICSelectors{Vendors: []string{"8086"}}
	if !Matches(sel, mgmt) || Selects(sel, mgmt) {
		t.Errorf("Matches = %t, Selects = %t; want true, false", Matches(sel, mgmt), Selects(sel, mgmt))
	}
}

// The link checks are the linkCheck setting's values, which the pools take
// as config decodes them.
func TestLinkChecksAreTheSettingsValues(t *testing.T) {
	for check, setting := range map[string]string{LinkCheckRDMAPort: config.LinkCheckRDMAPort, LinkCheckNetdev: config.LinkCheckNetdev, LinkCheckOff: config.LinkCheckOff} {
		if check != setting {
			t.Errorf("link check %q, setting %q", check, setting)
		}
	}
}
