package cditest

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// GPU is what ToolkitSpec needs of a GPU.
type GPU struct {
	Index, Minor int
	UUID         string
}

// ToolkitSpec is a spec shaped like the one the NVIDIA Container Toolkit
// (1.18+) regenerates at every boot in /var/run/cdi/nvidia.yaml: kind
// nvidia.com/gpu, every GPU by index and by UUID, and "all", with device
// nodes under devRoot. Paths are quoted, so any temporary directory works.
func ToolkitSpec(gpus []GPU, devRoot string) string {
	node := func(minor int) string {
		return fmt.Sprintf("    deviceNodes:\n    - {path: /dev/nvidia%d, hostPath: %q}\n", minor, filepath.Join(devRoot, "nvidia"+strconv.Itoa(minor)))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ncontainerEdits:\n  env: [NVIDIA_VISIBLE_DEVICES=void]\ndevices:\n")
	var all strings.Builder
	for _, g := range gpus {
		for _, name := range []string{strconv.Itoa(g.Index), g.UUID} {
			fmt.Fprintf(&b, "- name: %q\n  containerEdits:\n%s", name, node(g.Minor))
		}
		fmt.Fprintf(&all, "    - {path: /dev/nvidia%d, hostPath: %q}\n", g.Minor, filepath.Join(devRoot, "nvidia"+strconv.Itoa(g.Minor)))
	}
	fmt.Fprintf(&b, "- name: all\n  containerEdits:\n    deviceNodes:\n%s", all.String())
	return b.String()
}
