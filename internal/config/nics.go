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
	"time"

	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// NICResource is one pool of PCI NICs served as an extended resource.
// A NIC joins the first pool, in file order, whose selectors all match
// it. The NIC carrying the node's default route joins no pool unless a
// pool names its PCI address in pciAddresses.
//
// Example, for a GPU node with eight ConnectX-7 RDMA NICs, four per NUMA
// node (internal/config/testdata/example-nics.yaml):
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
	// With a cdi-* device-list strategy it is also the CDI kind, so it
	// must follow CDI's vendor/class rules too.
	Name      string       `json:"name"`
	Selectors NICSelectors `json:"selectors"`
	// LinkCheck is what makes a member unhealthy when its link is down:
	// LinkCheckRDMAPort, LinkCheckNetdev or LinkCheckOff; empty means
	// rdma-port for a NIC with RDMA ports and netdev for one without.
	LinkCheck string `json:"linkCheck,omitempty"`
	// RemovalGracePeriod is how long a member may be gone from sysfs
	// (listed unhealthy) before it leaves the pool; nil means
	// DefaultRemovalGracePeriod, 0s the first rescan that misses it.
	RemovalGracePeriod *Duration `json:"removalGracePeriod,omitempty"`
}

// Link checks, the values of NICResource.LinkCheck.
const (
	// LinkCheckRDMAPort judges the RDMA ports (infiniband/<dev>/ports/<n>
	// state and phys_state), what verbs users depend on; the IPoIB or
	// Ethernet netdev is ignored.
	LinkCheckRDMAPort = "rdma-port"
	// LinkCheckNetdev judges the host-namespace netdevs that are
	// administratively up by their link; an admin-down netdev is unused,
	// not broken.
	LinkCheckNetdev = "netdev"
	// LinkCheckOff never judges the link.
	LinkCheckOff = "off"
)

// DefaultRemovalGracePeriod is how long a NIC gone from sysfs stays in its
// pool (unhealthy) when the pool does not say.
const DefaultRemovalGracePeriod = 5 * time.Minute

// GracePeriod is the pool's removal grace period, defaulted.
func (r NICResource) GracePeriod() time.Duration {
	if r.RemovalGracePeriod == nil {
		return DefaultRemovalGracePeriod
	}
	return r.RemovalGracePeriod.Duration
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
	// PFOnly takes only physical functions (no SR-IOV VFs); VFOnly only
	// virtual functions. A PF with VFs enabled joins a pool only when the
	// pool names it (pciAddresses or netdevs), pfOnly or not: a pod must
	// not get a PF whose VFs other pods hold.
	PFOnly bool `json:"pfOnly,omitempty"`
	VFOnly bool `json:"vfOnly,omitempty"`
}

// IsEmpty reports whether no selector is set.
func (s NICSelectors) IsEmpty() bool {
	return len(s.Vendors) == 0 && len(s.Devices) == 0 && len(s.Drivers) == 0 && len(s.PCIAddresses) == 0 &&
		len(s.Netdevs) == 0 && len(s.NUMANodes) == 0 && s.RDMA == nil && len(s.LinkTypes) == 0 && !s.PFOnly && !s.VFOnly
}

// NamesNICs reports whether the selectors pick NICs by name (PCI address
// or host netdev) rather than by kind.
func (s NICSelectors) NamesNICs() bool {
	return len(s.PCIAddresses) > 0 || len(s.Netdevs) > 0
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
		return fmt.Errorf("config: %s: nicResources: want a list of pools, each with name and selectors (see internal/config/testdata/example-nics.yaml)", path)
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
		if g, ok := top["removalGracePeriod"]; ok {
			// Duration's own error names no field; name it here.
			var d Duration
			if err := json.Unmarshal(g, &d); err != nil {
				errs = append(errs, fmt.Errorf("%s.removalGracePeriod: %w", at, err))
				continue
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
var reservedResources = []string{resname.GPU}

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
			// The kernel prints a 4-digit domain, or 5 for VMD's 10000 and up.
			if _, err := sysfs.PCIAddress(v); err != nil || !slices.Contains([]int{4, 5}, len(strings.Split(v, ":")[0])) {
				bad("%s.pciAddresses[%d]: %q is not a PCI address DOMAIN:BUS:DEVICE.FUNCTION with a 4- or 5-digit domain (example: \"0000:18:00.0\", or \"10000:01:00.0\" behind VMD)", at, k, v)
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
		if s.PFOnly && s.VFOnly {
			bad("%s: pfOnly and vfOnly are both true, so the pool would take no NIC; set at most one", at)
		}
		at = fmt.Sprintf("nicResources[%d]", i)
		if r.LinkCheck != "" && !slices.Contains(linkChecks(), r.LinkCheck) {
			bad("%s.linkCheck: %q is not allowed; use one of %s, or leave it out (rdma-port for RDMA NICs, netdev for others)", at, r.LinkCheck, strings.Join(linkChecks(), ", "))
		}
		if g := r.RemovalGracePeriod; g != nil && g.Duration < 0 {
			bad("%s.removalGracePeriod: %s must not be negative; use 0s to drop a removed NIC at the next rescan, or leave it out for %s", at, g, DefaultRemovalGracePeriod)
		}
	}
	return errs
}

func linkChecks() []string { return []string{LinkCheckRDMAPort, LinkCheckNetdev, LinkCheckOff} }

// ValidateNICResources checks the pools for the device-list strategies in
// use: everything validateNICResources checks and, with a cdi-* strategy,
// that each name is a CDI kind the CDI library (ours and the runtime's)
// accepts, so names handed out resolve and nothing panics.
func ValidateNICResources(rs []NICResource, strategies []string) []error {
	errs := validateNICResources(rs)
	cdiCRI, cdiAnn := slices.Contains(strategies, "cdi-cri"), slices.Contains(strategies, "cdi-annotations")
	if !cdiCRI && !cdiAnn {
		return errs
	}
	st := "cdi-cri"
	if !cdiCRI {
		st = "cdi-annotations"
	}
	for i, r := range rs {
		if checkResourceName(r.Name) != nil {
			continue // already reported
		}
		if err := CheckCDIKind(r.Name); err != nil {
			errs = append(errs, fmt.Errorf("config: nicResources[%d].name: %q cannot be a CDI kind, which deviceListStrategy %s needs: %w; rename the pool (vendor and class each start with a letter, end with a letter or digit, and are at least 2 characters; example: \"example.com/rdma_numa0\") or drop the cdi-* strategies", i, r.Name, st, err))
			continue
		}
		if cdiAnn {
			// The runtime's annotation key is cdi.k8s.io/<owner>_<name with '_' for '/'>,
			// and <owner>_<…> must fit in 63 characters.
			if key := annotationOwner + "_" + strings.ReplaceAll(r.Name, "/", "_"); len(key) > 63 {
				errs = append(errs, fmt.Errorf("config: nicResources[%d].name: %q is too long for deviceListStrategy cdi-annotations: the CDI annotation key %q is %d characters, over 63; use a name of at most %d characters", i, r.Name, key, len(key), 63-len(annotationOwner)-1))
			}
		}
	}
	return errs
}

// annotationOwner is cdi.DefaultOwner, the plugin part of the CDI
// annotation key (config cannot import cdi).
const annotationOwner = "gpu-device-plugin"

// CheckCDIKind checks that name, a vendor/class pair, is a CDI kind the
// CDI library accepts. The library (v1.1.0) slices a one-character vendor
// or class out of range and panics, so those are refused first, and any
// other panic becomes an error.
func CheckCDIKind(name string) (err error) {
	vendor, class, ok := strings.Cut(name, "/")
	if !ok {
		return errors.New("not vendor/class")
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the CDI library panicked checking it: %v", r)
		}
	}()
	for _, part := range []struct{ what, v string }{{"vendor", vendor}, {"class", class}} {
		if len(part.v) < 2 {
			return fmt.Errorf("%s %q is shorter than 2 characters, which the CDI library cannot parse", part.what, part.v)
		}
	}
	if err := parser.ValidateVendorName(vendor); err != nil {
		return err
	}
	return parser.ValidateClassName(class)
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
