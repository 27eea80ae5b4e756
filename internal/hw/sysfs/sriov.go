package sysfs

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// virtfns lists a PF's virtfnN links in N order.
func virtfns(dev string) []string {
	entries, err := os.ReadDir(dev)
	if err != nil {
		return nil
	}
	type vf struct {
		n    int
		addr string
	}
	var vfs []vf
	for _, e := range entries {
		num, ok := strings.CutPrefix(e.Name(), "virtfn")
		if !ok {
			continue
		}
		k, err := strconv.Atoi(num)
		if err != nil {
			continue
		}
		if a := linkBase(filepath.Join(dev, e.Name())); a != "" {
			vfs = append(vfs, vf{k, a})
		}
	}
	slices.SortFunc(vfs, func(a, b vf) int { return cmp.Compare(a.n, b.n) })
	out := make([]string, len(vfs))
	for i, v := range vfs {
		out[i] = v.addr
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
