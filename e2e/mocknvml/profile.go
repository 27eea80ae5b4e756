package mocknvml

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// maxGPUs and maxLinks are the C library's limits (MAX_GPUS, NVML_NVLINK_MAX_LINKS).
const (
	maxGPUs  = 64
	maxLinks = 36
)

// Profile is a machine the mock library pretends to be, as LoadProfile reads
// it from the same text file the library parses at nvmlInit.
type Profile struct {
	// Name is the file's base name without ".profile".
	Name string
	// DriverVersion, NVMLVersion and CUDADriverVersion are empty or zero
	// when the profile leaves them out (NVML then answers NOT_SUPPORTED).
	DriverVersion     string
	NVMLVersion       string
	CUDADriverVersion int
	NVSwitches        []NVSwitch
	GPUs              []GPU
	PCIe              []PCIeRule
}

// NVSwitch is a switch that GPU NVLinks can lead to.
type NVSwitch struct {
	Name string
	// BusID is the canonical lower-case sysfs form, "0000:05:00.0".
	BusID string
}

// GPU is one GPU of a profile. Optional fields the profile leaves out are
// zero ("" or 0), except NUMANode, which is -1.
type GPU struct {
	Index int
	UUID  string
	Name  string
	// BusID is the canonical lower-case sysfs form, "0000:18:00.0".
	BusID     string
	Minor     int
	MemoryMiB uint64
	NUMANode  int
	// Temperatures are in Celsius.
	Temperature  int
	SlowdownTemp int
	ShutdownTemp int
	MaxTemp      int
	// Throttle is the clocks-event-reasons mask NVML reports before any fault.
	Throttle          uint64
	Architecture      string // "hopper"
	ComputeCapability string // "9.0"
	Brand             string // "nvidia"
	PCIDeviceID       uint32 // device and vendor, 0x233010de
	// NVLinks holds the remote end of each link in link order: an NVSwitch
	// name or "gpuN". Its length is the GPU's NVLink count.
	NVLinks []string
	// MIG is "on" or "off", the GPU's MIG mode; "" when the profile leaves
	// it out (the GPU cannot do MIG: NVML answers NOT_SUPPORTED).
	MIG string
	// Unsupported are the signals the GPU answers NOT_SUPPORTED to, in
	// the order Signals lists them: temp, throttle, recovery, remap.
	Unsupported []string
}

// Signals are the names the unsupported key takes: temperature, clocks
// event (throttle) reasons, the recovery-action field, remapped rows.
func Signals() []string { return []string{"temp", "throttle", "recovery", "remap"} }

// MemoryBytes is the total memory NVML reports.
func (g GPU) MemoryBytes() uint64 { return g.MemoryMiB << 20 }

// PCIeRule says that pairs of GPUs share at least Level as their nearest
// common PCIe ancestor: every pair on one NUMA node, or every pair in GPUs.
type PCIeRule struct {
	Level    string // internal, single, multiple, hostbridge, node or system
	SameNUMA bool
	GPUs     []int
}

var (
	arches = []string{"kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"}
	brands = []string{"quadro", "tesla", "nvs", "geforce", "titan", "quadro-rtx", "nvidia-rtx", "nvidia"}
	levels = []string{"internal", "single", "multiple", "hostbridge", "node", "system"}
)

// LoadProfile parses a profile file. It accepts exactly what the C library
// accepts, and its errors read "path:line: what is wrong" like the library's.
func LoadProfile(path string) (*Profile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening profile: %w", err)
	}
	defer f.Close()
	p := &Profile{Name: strings.TrimSuffix(filepath.Base(path), ".profile")}
	ps := &parser{path: path, p: p, defaults: GPU{NUMANode: -1}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		ps.line++
		if len(sc.Text()) > 4094 {
			return nil, ps.errorf("line longer than 4094 bytes")
		}
		if err := ps.parseLine(sc.Text()); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading profile %s: %w", path, err)
	}
	// References that may point forward: GPU links and rule members.
	for _, g := range p.GPUs {
		for _, end := range g.NVLinks {
			if n, ok := gpuRef(end); ok && n >= len(p.GPUs) {
				return nil, fmt.Errorf("%s: gpu %d: nvlink to gpu%d, but there are %d GPUs", path, g.Index, n, len(p.GPUs))
			}
		}
	}
	for i, r := range p.PCIe {
		for _, g := range r.GPUs {
			if g >= len(p.GPUs) {
				return nil, fmt.Errorf("%s: pcie rule %d names a GPU index beyond the %d GPUs", path, i+1, len(p.GPUs))
			}
		}
	}
	return p, nil
}

type parser struct {
	path     string
	line     int
	p        *Profile
	defaults GPU
}

func (ps *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", ps.path, ps.line, fmt.Sprintf(format, args...))
}

func (ps *parser) parseLine(line string) error {
	tok, ok := tokenize(line)
	if !ok || len(tok) > 64 {
		return ps.errorf("unterminated quote or more than 64 words")
	}
	if len(tok) == 0 {
		return nil
	}
	p := ps.p
	switch kw := tok[0]; kw {
	case "driver", "nvml":
		if len(tok) != 2 {
			return ps.errorf("usage: %s <version>", kw)
		}
		if err := ps.checkString(kw, tok[1], 79); err != nil {
			return err
		}
		if kw == "driver" {
			p.DriverVersion = tok[1]
		} else {
			p.NVMLVersion = tok[1]
		}
	case "cuda":
		v, err := parseUint(tok[len(tok)-1], 10, 1000000)
		if len(tok) != 2 || err != nil {
			return ps.errorf("usage: cuda <version as NVML's integer, 12040 for 12.4>")
		}
		p.CUDADriverVersion = int(v)
	case "nvswitch":
		if len(tok) != 3 {
			return ps.errorf("usage: nvswitch <name> <PCI address>")
		}
		if len(p.NVSwitches) == 64 {
			return ps.errorf("more than 64 nvswitches")
		}
		name := tok[1]
		if strings.HasPrefix(name, "gpu") {
			return ps.errorf("nvswitch %s: names starting with gpu are kept for GPU links", name)
		}
		for _, s := range p.NVSwitches {
			if s.Name == name {
				return ps.errorf("nvswitch %s declared twice", name)
			}
		}
		if err := ps.checkString("nvswitch name", name, 31); err != nil {
			return err
		}
		bus, err := parseBus(tok[2])
		if err != nil {
			return ps.errorf("nvswitch %s: %s is not a PCI address like 0000:05:00.0", name, tok[2])
		}
		p.NVSwitches = append(p.NVSwitches, NVSwitch{Name: name, BusID: bus})
	case "defaults":
		_, err := ps.parseGPUKeys(tok[1:], &ps.defaults, false)
		return err
	case "gpu":
		if len(p.GPUs) == maxGPUs {
			return ps.errorf("more than %d GPUs", maxGPUs)
		}
		var idx uint64
		var err error
		if len(tok) >= 2 {
			idx, err = parseUint(tok[1], 10, maxGPUs-1)
		}
		if len(tok) < 2 || err != nil {
			return ps.errorf("usage: gpu <index> key=value...")
		}
		if int(idx) != len(p.GPUs) {
			return ps.errorf("gpu %d: GPUs must be listed in index order, expected gpu %d", idx, len(p.GPUs))
		}
		g := ps.defaults
		g.NVLinks = append([]string(nil), ps.defaults.NVLinks...)
		g.Index = int(idx)
		identity, err := ps.parseGPUKeys(tok[2:], &g, true)
		if err != nil {
			return err
		}
		if identity != 3 {
			return ps.errorf("gpu %d: uuid, bus and minor are required", idx)
		}
		for i, o := range p.GPUs {
			switch {
			case o.UUID == g.UUID:
				return ps.errorf("gpu %d: uuid %s is also gpu %d's", idx, g.UUID, i)
			case o.BusID == g.BusID:
				return ps.errorf("gpu %d: bus is also gpu %d's", idx, i)
			case o.Minor == g.Minor:
				return ps.errorf("gpu %d: minor %d is also gpu %d's", idx, g.Minor, i)
			}
		}
		for _, s := range p.NVSwitches {
			if s.BusID == g.BusID {
				return ps.errorf("gpu %d: bus is also nvswitch %s's", idx, s.Name)
			}
		}
		p.GPUs = append(p.GPUs, g)
	case "pcie":
		if len(tok) < 3 {
			return ps.errorf("usage: pcie <level> same-numa | pcie <level> <GPU indexes>")
		}
		if len(p.PCIe) == 128 {
			return ps.errorf("more than 128 pcie rules")
		}
		r := PCIeRule{Level: tok[1]}
		if !contains(levels, r.Level) {
			return ps.errorf("pcie: level %s is not one of internal single multiple hostbridge node system", r.Level)
		}
		if len(tok) == 3 && tok[2] == "same-numa" {
			r.SameNUMA = true
		} else {
			gpus, err := ps.parseMembers(tok[2:])
			if err != nil {
				return err
			}
			r.GPUs = gpus
		}
		p.PCIe = append(p.PCIe, r)
	default:
		return ps.errorf("unknown keyword %s (want driver, nvml, cuda, nvswitch, defaults, gpu or pcie)", kw)
	}
	return nil
}

func (ps *parser) checkString(key, val string, max int) error {
	if val == "" {
		return ps.errorf("%s is empty", key)
	}
	if len(val) > max {
		return ps.errorf("%s %.40s... is longer than %d bytes", key, val, max)
	}
	return nil
}

// parseGPUKeys applies key=value words to g and counts the identity keys
// (uuid, bus, minor) it saw, which only gpu lines may carry.
func (ps *parser) parseGPUKeys(words []string, g *GPU, identity bool) (int, error) {
	seen := map[string]bool{}
	for _, w := range words {
		key, val, ok := strings.Cut(w, "=")
		if !ok {
			return 0, ps.errorf("%s: expected key=value", w)
		}
		if !identity && (key == "uuid" || key == "bus" || key == "minor") {
			return 0, ps.errorf("%s belongs on each gpu line, not in defaults", key)
		}
		switch key {
		case "uuid":
			if err := ps.checkString(key, val, 79); err != nil {
				return 0, err
			}
			if !strings.HasPrefix(val, "GPU-") {
				return 0, ps.errorf("uuid %s does not start with GPU-", val)
			}
			g.UUID = val
		case "name":
			if err := ps.checkString(key, val, 95); err != nil {
				return 0, err
			}
			g.Name = val
		case "bus":
			bus, err := parseBus(val)
			if err != nil {
				return 0, ps.errorf("bus %s is not a PCI address like 0000:18:00.0", val)
			}
			g.BusID = bus
		case "minor":
			v, err := parseUint(val, 10, 255)
			if err != nil {
				return 0, ps.errorf("minor %s is not a number from 0 to 255", val)
			}
			g.Minor = int(v)
		case "memory":
			v, err := parseUint(val, 10, 1<<40)
			if err != nil || v == 0 {
				return 0, ps.errorf("memory %s is not a size in MiB", val)
			}
			g.MemoryMiB = v
		case "numa":
			v, err := parseUint(val, 10, 1023)
			if err != nil {
				return 0, ps.errorf("numa %s is not a NUMA node number", val)
			}
			g.NUMANode = int(v)
		case "temp", "slowdown", "shutdown", "maxtemp":
			v, err := parseUint(val, 10, 200)
			if err != nil {
				return 0, ps.errorf("%s %s is not a temperature from 0 to 200 C", key, val)
			}
			switch key {
			case "temp":
				g.Temperature = int(v)
			case "slowdown":
				g.SlowdownTemp = int(v)
			case "shutdown":
				g.ShutdownTemp = int(v)
			default:
				g.MaxTemp = int(v)
			}
		case "throttle":
			v, err := parseUint(val, 16, ^uint64(0))
			if err != nil {
				return 0, ps.errorf("throttle %s is not a hex mask", val)
			}
			g.Throttle = v
		case "arch":
			if !contains(arches, val) {
				return 0, ps.errorf("arch %s is not one of %s", val, strings.Join(arches, " "))
			}
			g.Architecture = val
		case "brand":
			if !contains(brands, val) {
				return 0, ps.errorf("brand %s is not one of %s", val, strings.Join(brands, " "))
			}
			g.Brand = val
		case "cc":
			major, minor, ok := strings.Cut(val, ".")
			_, err1 := parseUint(major, 10, 99)
			_, err2 := parseUint(minor, 10, 99)
			if !ok || len(major) >= 16 || err1 != nil || err2 != nil {
				return 0, ps.errorf("cc %s is not major.minor like 9.0", val)
			}
			g.ComputeCapability = val
		case "pciid":
			v, err := parseUint(val, 16, 0xffffffff)
			if err != nil {
				return 0, ps.errorf("pciid %s is not a hex device+vendor id like 0x233010de", val)
			}
			g.PCIDeviceID = uint32(v)
		case "nvlink":
			links, err := ps.parseNVLinks(val)
			if err != nil {
				return 0, err
			}
			g.NVLinks = links
		case "mig":
			if val != "on" && val != "off" {
				return 0, ps.errorf("mig %s is not on or off", val)
			}
			g.MIG = val
		case "unsupported":
			sigs, err := ps.parseUnsupported(val)
			if err != nil {
				return 0, err
			}
			g.Unsupported = sigs
		default:
			return 0, ps.errorf("unknown key %s", key)
		}
		if key == "uuid" || key == "bus" || key == "minor" {
			seen[key] = true
		}
	}
	return len(seen), nil
}

// parseNVLinks reads "end*count,end,..." where end is a declared switch or gpuN.
func (ps *parser) parseNVLinks(val string) ([]string, error) {
	if val == "none" {
		return nil, nil
	}
	var links []string
	for item := range strings.SplitSeq(val, ",") {
		if item == "" {
			continue // the C parser's strtok skips empty items
		}
		end, countStr, starred := strings.Cut(item, "*")
		count := uint64(1)
		if starred {
			c, err := parseUint(countStr, 10, maxLinks)
			if err != nil || c == 0 {
				return nil, ps.errorf("nvlink: %s*%s: the count must be 1 to %d", end, countStr, maxLinks)
			}
			count = c
		}
		known := false
		for _, s := range ps.p.NVSwitches {
			known = known || s.Name == end
		}
		if _, isGPU := gpuRef(end); !known && !isGPU {
			return nil, ps.errorf("nvlink: %s is neither an nvswitch declared above nor gpuN", end)
		}
		if len(links)+int(count) > maxLinks {
			return nil, ps.errorf("nvlink: more than %d links", maxLinks)
		}
		for range count {
			links = append(links, end)
		}
	}
	if len(links) == 0 {
		return nil, ps.errorf("nvlink: empty list (write nvlink=none for a GPU without NVLink)")
	}
	return links, nil
}

// parseUnsupported reads "temp,throttle,recovery,remap" or "none".
func (ps *parser) parseUnsupported(val string) ([]string, error) {
	if val == "none" {
		return nil, nil
	}
	set := map[string]bool{}
	for item := range strings.SplitSeq(val, ",") {
		if item == "" {
			continue // the C parser's strtok skips empty items
		}
		if !contains(Signals(), item) {
			return nil, ps.errorf("unsupported: %s is not one of temp throttle recovery remap", item)
		}
		set[item] = true
	}
	var out []string
	for _, s := range Signals() {
		if set[s] {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, ps.errorf("unsupported: empty list (write unsupported=none for none)")
	}
	return out, nil
}

// gpuRef reports whether an NVLink end names a GPU ("gpu3"), and which.
func gpuRef(end string) (int, bool) {
	s, ok := strings.CutPrefix(end, "gpu")
	if !ok {
		return 0, false
	}
	n, err := parseUint(s, 10, maxGPUs-1)
	return int(n), err == nil
}

// parseMembers reads GPU indexes and ranges: "0 1", "0-3", "0,2,4-5".
func (ps *parser) parseMembers(words []string) ([]int, error) {
	var set [maxGPUs]bool
	for _, w := range words {
		for item := range strings.SplitSeq(w, ",") {
			if item == "" {
				continue
			}
			loStr, hiStr, isRange := strings.Cut(item, "-")
			lo, err := parseUint(loStr, 10, maxGPUs-1)
			if err != nil {
				return nil, ps.errorf("pcie: %s is not a GPU index", w)
			}
			hi := lo
			if isRange {
				if hi, err = parseUint(hiStr, 10, maxGPUs-1); err != nil || hi < lo {
					return nil, ps.errorf("pcie: %s is not a GPU range like 0-3", w)
				}
			}
			for g := lo; g <= hi; g++ {
				set[g] = true
			}
		}
	}
	var gpus []int
	for g, in := range set {
		if in {
			gpus = append(gpus, g)
		}
	}
	if len(gpus) == 0 {
		return nil, ps.errorf("pcie: no GPUs given (list indexes like 0 1 or 0-3, or write same-numa)")
	}
	return gpus, nil
}

// tokenize splits a line on blanks; a double-quoted run keeps its blanks and
// loses its quotes, and # outside quotes starts a comment. ok is false for
// an unterminated quote.
func tokenize(line string) (tok []string, ok bool) {
	var cur strings.Builder
	inTok, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '"':
			quoted = !quoted
			inTok = true
		case !quoted && (c == ' ' || c == '\t' || c == '\r' || c == '\n'):
			if inTok {
				tok = append(tok, cur.String())
				cur.Reset()
				inTok = false
			}
		case !quoted && c == '#':
			if inTok {
				tok = append(tok, cur.String())
			}
			return tok, true
		default:
			cur.WriteByte(c)
			inTok = true
		}
	}
	if quoted {
		return nil, false
	}
	if inTok {
		tok = append(tok, cur.String())
	}
	return tok, true
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

var errSyntax = errors.New("malformed number")

// parseUint parses a whole unsigned number; base 16 takes an optional 0x.
func parseUint(s string, base int, max uint64) (uint64, error) {
	if base == 16 {
		if t, ok := strings.CutPrefix(strings.ToLower(s), "0x"); ok {
			s = t
		}
	}
	if s == "" || s[0] == '+' || s[0] == '-' {
		return 0, errSyntax
	}
	v, err := strconv.ParseUint(s, base, 64)
	if err != nil || v > max {
		return 0, errSyntax
	}
	return v, nil
}

// parseBus accepts [domain:]bus:device.function in hex and returns the
// canonical lower-case sysfs form.
func parseBus(s string) (string, error) {
	rest, fnStr, ok := strings.Cut(s, ".")
	if !ok || strings.ContainsAny(fnStr, ".:") {
		return "", errSyntax
	}
	parts := strings.Split(rest, ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return "", errSyntax
	}
	parts = append(parts, fnStr)
	width := []int{8, 2, 2, 1}
	max := []uint64{0xffffffff, 0xff, 0x1f, 0x7}
	var v [4]uint64
	for i, part := range parts {
		if len(part) > width[i] || strings.HasPrefix(strings.ToLower(part), "0x") {
			return "", errSyntax
		}
		n, err := parseUint(part, 16, max[i])
		if err != nil {
			return "", errSyntax
		}
		v[i] = n
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", v[0], v[1], v[2], v[3]), nil
}

// WriteSysfs writes what the plugin reads from sysfs for each GPU under root
// (normally a test's temporary directory standing in for /sys):
// bus/pci/devices/<bus id>/numa_node, and vendor and device when the
// profile gives a pciid.
func (p *Profile) WriteSysfs(root string) error {
	for _, g := range p.GPUs {
		dir := filepath.Join(root, "bus", "pci", "devices", g.BusID)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("writing sysfs for GPU %d: %w", g.Index, err)
		}
		files := map[string]string{"numa_node": fmt.Sprintf("%d\n", g.NUMANode)}
		if g.PCIDeviceID != 0 {
			files["vendor"] = fmt.Sprintf("0x%04x\n", g.PCIDeviceID&0xffff)
			files["device"] = fmt.Sprintf("0x%04x\n", g.PCIDeviceID>>16)
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				return fmt.Errorf("writing sysfs for GPU %d: %w", g.Index, err)
			}
		}
	}
	return nil
}

// WriteDev creates the device nodes the plugin hands to containers, as empty
// files under root (standing in for /dev): nvidia<minor> for each GPU,
// nvidiactl, nvidia-uvm and nvidia-uvm-tools.
func (p *Profile) WriteDev(root string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("writing dev: %w", err)
	}
	names := []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
	for _, g := range p.GPUs {
		names = append(names, fmt.Sprintf("nvidia%d", g.Minor))
	}
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(root, name), nil, 0o666); err != nil {
			return fmt.Errorf("writing dev: %w", err)
		}
	}
	return nil
}
