package runtimes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// table is a decoded TOML file: nested map[string]any.
type table = map[string]any

// tomlFile is one config file as read: its host path and its tables.
type tomlFile struct {
	path string
	t    table
}

// readTOML decodes the TOML file at host path p under root. A missing
// file is (nil, nil).
func readTOML(root, p string) (table, error) {
	data, err := os.ReadFile(under(root, p))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p, err)
	}
	t := table{}
	if err := toml.Unmarshal(data, &t); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", p, err)
	}
	return t, nil
}

// lookup walks keys down t; nil when a key is missing or not a table.
func lookup(t table, keys ...string) any {
	var v any = t
	for _, k := range keys {
		m, ok := v.(table)
		if !ok {
			return nil
		}
		if v, ok = m[k]; !ok {
			return nil
		}
	}
	return v
}

// str is lookup's string, "" when missing or not a string.
func str(t table, keys ...string) string {
	s, _ := lookup(t, keys...).(string)
	return s
}

// merge lays src over dst: tables merge key by key, anything else in src
// replaces dst's, as containerd and CRI-O merge their drop-ins.
func merge(dst, src table) table {
	if dst == nil {
		dst = table{}
	}
	for k, v := range src {
		if sub, ok := v.(table); ok {
			if have, ok := dst[k].(table); ok {
				dst[k] = merge(have, sub)
				continue
			}
			dst[k] = merge(nil, sub)
			continue
		}
		dst[k] = v
	}
	return dst
}

// lastSetting is the host path of the last of files that sets keys, as
// merge applies them; "" when none does.
func lastSetting(files []tomlFile, keys ...string) string {
	p := ""
	for _, f := range files {
		if lookup(f.t, keys...) != nil {
			p = f.path
		}
	}
	return p
}

// dotted is keys as a TOML dotted key, quoting those with dots.
func dotted(keys ...string) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		if strings.ContainsAny(k, ". ") {
			k = strconv.Quote(k)
		}
		parts[i] = k
	}
	return strings.Join(parts, ".")
}
