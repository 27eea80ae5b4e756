package sysfs

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// rtfUp is RTF_UP from <linux/route.h>: the route is usable.
const rtfUp = 0x1

// DefaultRouteInterfaces returns the interfaces that carry a default
// route, IPv4 (<procRoot>/net/route) or IPv6 (<procRoot>/net/ipv6_route),
// sorted and without repeats. A missing ipv6_route (IPv6 disabled) is not
// an error; a missing or unreadable route file is.
func DefaultRouteInterfaces(procRoot string) ([]string, error) {
	var out []string
	v4, err := defaultRoutes(filepath.Join(procRoot, "net", "route"), true, defaultRouteV4)
	if err != nil {
		return nil, err
	}
	out = append(out, v4...)
	v6, err := defaultRoutes(filepath.Join(procRoot, "net", "ipv6_route"), false, defaultRouteV6)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	out = append(out, v6...)
	slices.Sort(out)
	return slices.Compact(out), nil
}

// defaultRoutes reads a route table of procfs, line by line (the first is
// skipped when it is a header), and lists the interfaces iface finds a
// default route on.
func defaultRoutes(path string, header bool, iface func(fields []string) (string, bool)) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading default route: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for first := true; sc.Scan(); first = false {
		if first && header {
			continue
		}
		if name, ok := iface(strings.Fields(sc.Text())); ok {
			out = append(out, name)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return out, nil
}

// defaultRouteV4 is a line of /proc/net/route, after its header:
// "Iface Destination Gateway Flags RefCnt Use Metric Mask …" in hex.
func defaultRouteV4(fields []string) (string, bool) {
	if len(fields) < 8 {
		return "", false
	}
	flags, err := strconv.ParseUint(fields[3], 16, 32)
	if err != nil {
		return "", false
	}
	return fields[0], fields[1] == "00000000" && fields[7] == "00000000" && flags&rtfUp != 0
}

// defaultRouteV6 is a line of /proc/net/ipv6_route: "dest destlen src
// srclen nexthop metric refcnt use flags iface". The kernel lists the
// lo-bound unreachable route ::/0 too; it never names a NIC, so it is
// dropped.
func defaultRouteV6(fields []string) (string, bool) {
	if len(fields) < 10 {
		return "", false
	}
	flags, err := strconv.ParseUint(fields[8], 16, 32)
	if err != nil {
		return "", false
	}
	return fields[9], strings.Trim(fields[0], "0") == "" && fields[1] == "00" && flags&rtfUp != 0 && fields[9] != "lo"
}

// lowerNetdevs follows a netdev down through bonds, VLANs and bridges
// (their lower_<name> links in sysfs) and returns it with every netdev
// beneath it.
func lowerNetdevs(sysfsRoot, name string) []string {
	seen := map[string]bool{}
	var walk func(string, int)
	walk = func(nd string, depth int) {
		if seen[nd] || depth > 8 {
			return
		}
		seen[nd] = true
		entries, err := os.ReadDir(filepath.Join(sysfsRoot, "class", "net", nd))
		if err != nil {
			return
		}
		for _, e := range entries {
			if lower, ok := strings.CutPrefix(e.Name(), "lower_"); ok {
				walk(lower, depth+1)
			}
		}
	}
	walk(name, 0)
	out := make([]string, 0, len(seen))
	for nd := range seen {
		out = append(out, nd)
	}
	slices.Sort(out)
	return out
}
