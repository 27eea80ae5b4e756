package sysfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeNUMANode creates <root>/bus/pci/devices/<addr>/numa_node holding content.
func writeNUMANode(t *testing.T, root, addr, content string) {
	t.Helper()
	dir := filepath.Join(root, "bus", "pci", "devices", addr)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadNUMANode(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    int
	}{
		{name: "node zero", content: "0\n", want: 0},
		{name: "node one", content: "1\n", want: 1},
		{name: "no newline", content: "3", want: 3},
		{name: "kernel says unknown", content: "-1\n", want: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			writeNUMANode(t, root, "0000:07:00.0", tt.content)
			got, err := ReadNUMANode(root, "0000:07:00.0")
			if err != nil {
				t.Fatalf("ReadNUMANode: %v", err)
			}
			if got != tt.want {
				t.Errorf("ReadNUMANode = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestReadNUMANodeErrors(t *testing.T) {
	tests := []struct {
		name      string
		content   *string // nil: no file at all
		addr      string
		emptyRoot bool
		wantIs    error
	}{
		{name: "missing file", content: nil, addr: "0000:07:00.0", wantIs: fs.ErrNotExist},
		{name: "letters", content: ptr("abc\n"), addr: "0000:07:00.0", wantIs: ErrMalformed},
		{name: "empty file", content: ptr(""), addr: "0000:07:00.0", wantIs: ErrMalformed},
		{name: "below -1", content: ptr("-2\n"), addr: "0000:07:00.0", wantIs: ErrMalformed},
		{name: "two values", content: ptr("0 1\n"), addr: "0000:07:00.0", wantIs: ErrMalformed},
		{name: "address escaping the tree", content: ptr("0\n"), addr: "../../etc", wantIs: ErrMalformed},
		{name: "empty root", content: ptr("0\n"), addr: "0000:07:00.0", emptyRoot: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if tt.content != nil {
				writeNUMANode(t, root, "0000:07:00.0", *tt.content)
			}
			if tt.emptyRoot {
				root = ""
			}
			got, err := ReadNUMANode(root, tt.addr)
			if err == nil {
				t.Fatalf("ReadNUMANode = %d, want an error", got)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error %v does not match %v", err, tt.wantIs)
			}
			if tt.wantIs != nil && tt.addr == "0000:07:00.0" && !strings.Contains(err.Error(), filepath.Join(root, "bus", "pci", "devices", tt.addr, "numa_node")) {
				t.Errorf("error %q does not name the path", err)
			}
		})
	}
}

func ptr(s string) *string { return &s }
