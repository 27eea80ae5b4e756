package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/gpu-device-plugin/gpu-device-plugin/sysfs"
)

// NICResource is one pool of PCI NICs served as an extended resource.
// A NIC joins the first pool, in file order, whose selectors all match
// it. The NIC carrying the node's default route joins no pool unless a
// pool names its PCI address in pciAddresses.
//
// Example, for a GPU node with eight ConnectX-7 RDMA NICs, four per NUMA
// node (config/testdata/example-nics.yaml):
//
//	nicResources:
//	  - name: example.com/rdma_numa0
//	    selectors:
//	      vendors: ["15b3"]        # Mellanox/NVIDIA
//	      devices: ["1021"]        # ConnectX-7
//	      drivers: ["mlx5_core"]
//	      rdma: true
//	      numaNodes: [0]
//	  - name: example.com/rdma_numa1
//	    selectors:
//	      vendors: ["15b3"]
//	      devices: ["1021"]
//	      drivers: ["mlx5_core"]
//	      rdma: true
//	      numaNodes: [1]
//
// A pod asking for example.com/rdma_numa0: 2 gets two NICs on node 0, the
// PCI addresses in PCIDEVICE_EXAMPLE_COM_RDMA_NUMA0 and their
// /dev/infiniband/uverbsN plus rdma_cm.
type NICResource struct {
	// Name is the full extended-resource name, <vendor-domain>/<name>.
	Name      string       `json:"name"`
	Selectors NICSelectors `json:"selectors"`
}

// NICSelectors choose NICs. Every selector that is set must match; a
// list matches when any of its values does. Hex IDs are 4 digits, in
// quotes so YAML keeps them strings.
type NICSelectors struct {
	Vendors      []string `json:"vendors,omitempty"`      // PCI vendor IDs: "15b3"
	Devices      []string `json:"devices,omitempty"`      // PCI device IDs: "1021"
	Drivers      []string `json:"drivers,omitempty"`      // bound drivers: "mlx5_core", "vfio-pci"
	PCIAddresses []string `json:"pciAddresses,omitempty"` // "0000:18:00.0"
	Netdevs      []string `json:"netdevs,omitempty"`      // interface names in the host namespace: "ibp24s0"
	NUMANodes    []int    `json:"numaNodes,omitempty"`    // a NIC with no known node matches none
	// RDMA, when set, requires (true) or excludes (false) NICs with verbs
	// devices.
	RDMA      *bool    `json:"rdma,omitempty"`
	LinkTypes []string `json:"linkTypes,omitempty"` // "ether" or "infiniband"
}

// IsEmpty reports whether no selector is set.
func (s NICSelectors) IsEmpty() bool {
	return len(s.Vendors) == 0 && len(s.Devices) == 0 && len(s.Drivers) == 0 && len(s.PCIAddresses) == 0 &&
		len(s.Netdevs) == 0 && len(s.NUMANodes) == 0 && s.RDMA == nil && len(s.LinkTypes) == 0
}

// jsonKeys lists a struct's JSON keys, for "known keys" hints.
func jsonKeys(v any) []string {
	t := reflect.TypeOf(v)
	var out []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		out = append(out, name)
	}
	return out
}

// checkNICResources decodes each nicResources entry on its own so that an
// unknown or mistyped key is reported with the entry's index, which the
// whole-file decoder cannot do. It leaves anything that is not a list of
// entries to that decoder. Each error starts "config: <path>: ".
func checkNICResources(path string, data []byte) error {
	var doc struct {
		NICResources json.RawMessage `json:"nicResources"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.NICResources) == 0 || string(doc.NICResources) == "null" {
		return nil
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(doc.NICResources, &entries); err != nil {
		return fmt.Errorf("config: %s: nicResources: want a list of pools, each with name and selectors (see config/testdata/example-nics.yaml)", path)
	}
	var errs []error
	for i, raw := range entries {
		at := fmt.Sprintf("nicResources[%d]", i)
		var top map[string]json.RawMessage
		if err := json.Unmarshal(raw, &top); err != nil {
			errs = append(errs, fmt.Errorf("%s: want a pool with name and selectors", at))
			continue
		}
		errs = append(errs, unknownKeys(at, top, jsonKeys(NICResource{}))...)
		if sel, ok := top["selectors"]; ok {
			var keys map[string]json.RawMessage
			if err := json.Unmarshal(sel, &keys); err == nil {
				errs = append(errs, unknownKeys(at+".selectors", keys, jsonKeys(NICSelectors{}))...)
			}
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		var r NICResource
		var te *json.UnmarshalTypeError
		if err := dec.Decode(&r); errors.As(err, &te) {
			errs = append(errs, typeError(at, te))
		}
	}
	for i, err := range errs {
		errs[i] = fmt.Errorf("config: %s: %w", path, err)
	}
	return errors.Join(errs...)
}

func unknownKeys(at string, got map[string]json.RawMessage, known []string) []error {
	var errs []error
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(known, k) {
			errs = append(errs, fmt.Errorf("%s: unknown key %q; known keys: %s", at, k, strings.Join(known, ", ")))
		}
	}
	return errs
}

func typeError(at string, te *json.UnmarshalTypeError) error {
	field := at
	if te.Field != "" {
		field += "." + te.Field
	}
	want := map[reflect.Kind]string{
		reflect.String: "a string", reflect.Int: "a whole number", reflect.Bool: "true or false",
		reflect.Slice: "a list", reflect.Struct: "a map of keys",
	}[te.Type.Kind()]
	if want == "" {
		want = te.Type.String()
	}
	msg := fmt.Sprintf("%s: got %s, want %s", field, article(te.Value), want)
	if te.Value == "number" && (strings.HasSuffix(te.Field, "vendors") || strings.HasSuffix(te.Field, "devices")) {
		// YAML reads 1021 as a number and 0101 as octal 65.
		msg += `: quote hex IDs (example: devices: ["1021"])`
	}
	return errors.New(msg)
}

func article(jsonKind string) string {
	switch jsonKind {
	case "array":
		return "a list"
	case "object":
		return "a map"
	case "bool":
		return "true or false"
	}
	return "a " + jsonKind
}

var (
	hexID = regexp.MustCompile(`^[0-9a-fA-F]{4}$`)
	// dnsSubdomain is a DNS-1123 subdomain, as Kubernetes checks a
	// resource name's domain.
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// qualifiedName is the part after the slash.
	qualifiedName = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
	// netdevName is what the kernel accepts as an interface name.
	netdevName = regexp.MustCompile(`^[^/:\s]{1,15}$`)
)

// reservedResources are served by the plugin itself.
var reservedResources = []string{"nvidia.com/gpu"}

// validateNICResources checks every pool and names each problem by index
// and field.
func validateNICResources(rs []NICResource) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("config: "+format, a...)) }
	seen := map[string]int{}
	for i, r := range rs {
		at := fmt.Sprintf("nicResources[%d]", i)
		if err := checkResourceName(r.Name); err != nil {
			bad("%s.name: %q %v (example: \"example.com/rdma_numa0\")", at, r.Name, err)
		} else if j, dup := seen[r.Name]; dup {
			bad("%s.name: %q is already the name of nicResources[%d]; each pool needs its own name", at, r.Name, j)
		} else {
			seen[r.Name] = i
		}
		s := r.Selectors
		at += ".selectors"
		if s.IsEmpty() {
			bad("%s: no selector is set, so the pool would take every NIC; set at least one of %s", at, strings.Join(jsonKeys(NICSelectors{}), ", "))
		}
		for k, v := range s.Vendors {
			if !hexID.MatchString(v) {
				bad("%s.vendors[%d]: %q is not a 4-digit hex PCI vendor ID (example: \"15b3\")", at, k, v)
			}
		}
		for k, v := range s.Devices {
			if !hexID.MatchString(v) {
				bad("%s.devices[%d]: %q is not a 4-digit hex PCI device ID (example: \"1021\")", at, k, v)
			}
		}
		for k, v := range s.Drivers {
			if v == "" || strings.ContainsAny(v, "/ \t\n") {
				bad("%s.drivers[%d]: %q is not a kernel driver name (example: \"mlx5_core\")", at, k, v)
			}
		}
		for k, v := range s.PCIAddresses {
			if _, err := sysfs.PCIAddress(v); err != nil || len(strings.Split(v, ":")[0]) != 4 {
				bad("%s.pciAddresses[%d]: %q is not a PCI address DOMAIN:BUS:DEVICE.FUNCTION (example: \"0000:18:00.0\")", at, k, v)
			}
		}
		for k, v := range s.Netdevs {
			if !netdevName.MatchString(v) || v == "." || v == ".." {
				bad("%s.netdevs[%d]: %q is not a network interface name (1 to 15 characters, no '/', ':' or spaces; example: \"ibp24s0\")", at, k, v)
			}
		}
		for k, v := range s.NUMANodes {
			if v < 0 {
				bad("%s.numaNodes[%d]: %d is not a NUMA node; use 0 or more (a NIC with no known node matches no numaNodes selector)", at, k, v)
			}
		}
		for k, v := range s.LinkTypes {
			if v != sysfs.LinkEther && v != sysfs.LinkInfiniBand {
				bad("%s.linkTypes[%d]: %q is not allowed; use one of %s, %s", at, k, v, sysfs.LinkEther, sysfs.LinkInfiniBand)
			}
		}
	}
	return errs
}

// checkResourceName applies the kubelet's rules for an extended-resource
// name: a domain, a slash and a qualified name, outside kubernetes.io.
func checkResourceName(name string) error {
	domain, short, ok := strings.Cut(name, "/")
	switch {
	case !ok || domain == "" || short == "":
		return errors.New("is not a full extended-resource name <vendor-domain>/<name>")
	case len(domain) > 253 || !dnsSubdomain.MatchString(domain):
		return fmt.Errorf("has domain %q, which is not a lower-case DNS name", domain)
	case domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io"):
		return errors.New("is in the kubernetes.io domain, which is reserved for Kubernetes")
	case len(short) > 63 || !qualifiedName.MatchString(short):
		return fmt.Errorf("has name %q, which is not 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", short)
	case slices.Contains(reservedResources, name):
		return errors.New("is served by the plugin itself")
	}
	return nil
}
