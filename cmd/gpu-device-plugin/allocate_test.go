package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml/nvmltest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/allocator"
)

// runAllocate runs `allocate` on the mock DGX A100 (GPUs 0-3 on NUMA node
// 0, 4-7 on node 1, pairs 0-1, 2-3, ... behind common PCIe switches, 12
// NVLinks between every pair through NVSwitch).
func runAllocate(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	return runAllocateWith(t, mockOpen, args...)
}

func runAllocateWith(t *testing.T, open func(string) (nvml.Library, error), args ...string) (string, string, error) {
	t.Helper()
	return run(t, open, append([]string{"allocate", "--sysfs-root", t.TempDir()}, args...)...)
}

func TestAllocateJSON(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    []int // GPU indices; nil: check only node
		node    int
		pairs   int
		nvlinks int
	}{
		{name: "a PCIe-switch pair on one node", args: []string{"--size", "2"}, want: []int{0, 1}, node: 0, pairs: 1, nvlinks: 12},
		{name: "only from available, by index", args: []string{"-n", "2", "--available", "1,2,3,4,6"}, want: []int{2, 3}, node: 0, pairs: 1, nvlinks: 12},
		{name: "a must-include keeps its node", args: []string{"--size", "3", "--must-include", "7"}, node: 1, pairs: 3, nvlinks: 12},
		{name: "the tighter node for one", args: []string{"--size", "1", "--available", "0,1,2,3,4"}, want: []int{4}, node: 1},
		{name: "four fill a node", args: []string{"--size", "4"}, want: []int{0, 1, 2, 3}, node: 0, pairs: 6, nvlinks: 12},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := runAllocate(t, append(tt.args, "-o", "json")...)
			if err != nil {
				t.Fatal(err)
			}
			var a allocation
			if err := json.Unmarshal([]byte(out), &a); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			var got []int
			for _, g := range a.GPUs {
				got = append(got, g.Index)
				if g.NUMANode != tt.node || !strings.HasPrefix(g.UUID, "GPU-") {
					t.Errorf("GPU %+v, want NUMA node %d", g, tt.node)
				}
			}
			if tt.want != nil && !slices.Equal(got, tt.want) {
				t.Errorf("chose GPUs %v, want %v", got, tt.want)
			}
			if !a.Exact || a.Score.NUMANodes != 1 || len(a.Pairs) != tt.pairs {
				t.Errorf("exact %v, score %+v, %d pairs; want exact, one NUMA node, %d pairs", a.Exact, a.Score, len(a.Pairs), tt.pairs)
			}
			var link int64
			for _, p := range a.Pairs {
				link += int64(p.Weight)
				if p.NVLinks != tt.nvlinks {
					t.Errorf("pair %+v, want %d NVLinks", p, tt.nvlinks)
				}
			}
			if link != a.Score.Link {
				t.Errorf("pair weights sum to %d, score link is %d", link, a.Score.Link)
			}
		})
	}
}

func TestAllocateMustIncludeByUUID(t *testing.T) {
	// The mock draws UUIDs when it is built: keep one.
	s := nvmltest.NewDGXA100()
	uuid := nvmltest.Device(s, 5).UUID
	open := func(string) (nvml.Library, error) { return s, nil }
	out, _, err := runAllocateWith(t, open, "--size", "2", "--must-include", uuid, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var a allocation
	if err := json.Unmarshal([]byte(out), &a); err != nil {
		t.Fatal(err)
	}
	// 4-5 share a PCIe switch: the best partner of 5.
	if len(a.GPUs) != 2 || a.GPUs[0].Index != 4 || a.GPUs[1].UUID != uuid {
		t.Errorf("chose %+v, want GPUs 4 and 5", a.GPUs)
	}
}

func TestAllocateTable(t *testing.T) {
	out, _, err := runAllocate(t, "--size", "2")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"INDEX", "2 of 8 available GPUs, exact", "link       12031", "NUMA nodes 1", "0-1", "multiple-switches"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(out, "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[1], "0 ") || !strings.HasPrefix(lines[2], "1 ") {
		t.Errorf("table rows:\n%s", out)
	}
}

func TestAllocateRefuses(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
		is   error
	}{
		{name: "no size", args: nil, want: "--size is required"},
		{name: "more than available", args: []string{"--size", "3", "--available", "0,1"}, want: "exceeds the 2 available", is: allocator.ErrBadRequest},
		{name: "unknown GPU", args: []string{"--size", "1", "--available", "GPU-nope"}, want: `--available: "GPU-nope" is neither`},
		{name: "must-include not available", args: []string{"--size", "2", "--available", "0,1", "--must-include", "5"}, want: "not available", is: allocator.ErrBadRequest},
		{name: "bad output", args: []string{"--size", "1", "-o", "yaml"}, want: `--output: "yaml"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := runAllocate(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to say %q", err, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("err = %v, want %v", err, tt.is)
			}
		})
	}
}

func TestAllocateWithoutDriver(t *testing.T) {
	_, _, err := runAllocateWith(t, noDriver, "--size", "1")
	if !errors.Is(err, nvml.ErrNoDriver) {
		t.Fatalf("err = %v, want ErrNoDriver", err)
	}
}

// With imex.channelIDs, allocate says which IMEX channel every
// allocation also gets, or why none and what serve does; it makes no
// node. Without it, nothing is said.
func TestAllocateIMEX(t *testing.T) {
	procRoot := func(t *testing.T, imex bool) string {
		t.Helper()
		devices := "Character devices:\n195 nvidia\n"
		if imex {
			devices += "234 nvidia-caps-imex-channels\n"
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "devices"), []byte(devices+"\nBlock devices:\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	t.Run("json: given, node made by serve", func(t *testing.T) {
		dev := t.TempDir()
		out, _, err := runAllocate(t, "--size", "1", "-o", "json", "--proc-root", procRoot(t, true), "--dev-root", dev, "--imex-channel-ids", "0")
		if err != nil {
			t.Fatal(err)
		}
		var a allocation
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		want := []allocatedIMEX{{ID: 0, Path: "/dev/nvidia-caps-imex-channels/channel0", Given: true}}
		if !reflect.DeepEqual(a.IMEXChannels, want) {
			t.Errorf("imexChannels = %+v, want %+v", a.IMEXChannels, want)
		}
		if !strings.Contains(out, `"imexChannels": [`) || !strings.Contains(out, `"given": true`) || !strings.Contains(out, `"present": false`) {
			t.Errorf("JSON keys:\n%s", out)
		}
		if entries, _ := os.ReadDir(dev); len(entries) != 0 {
			t.Errorf("allocate made %v under --dev-root", entries)
		}
	})
	t.Run("table: no IMEX support, required", func(t *testing.T) {
		proc := procRoot(t, false)
		out, _, err := runAllocate(t, "--size", "2", "--proc-root", proc, "--dev-root", t.TempDir(), "--imex-channel-ids", "0", "--imex-required", "true")
		if err != nil {
			t.Fatal(err)
		}
		want := "IMEX channel 0: none: " + filepath.Join(proc, "devices") + " lists no nvidia-caps-imex-channels character device: the driver has no IMEX support; imex.required is true, so serve stops at start\n"
		if !strings.HasSuffix(out, want) {
			t.Errorf("table does not end with %q:\n%s", want, out)
		}
	})
	t.Run("table: given", func(t *testing.T) {
		out, _, err := runAllocate(t, "--size", "2", "--proc-root", procRoot(t, true), "--dev-root", t.TempDir(), "--imex-channel-ids", "0")
		if err != nil {
			t.Fatal(err)
		}
		if want := "\nIMEX channel 0: /dev/nvidia-caps-imex-channels/channel0 with every allocation (serve makes the node at start)\n"; !strings.HasSuffix(out, want) {
			t.Errorf("table does not end with %q:\n%s", want, out)
		}
	})
	t.Run("not set: nothing said", func(t *testing.T) {
		out, _, err := runAllocate(t, "--size", "1", "-o", "json", "--proc-root", procRoot(t, true))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "imex") {
			t.Errorf("imexChannels without imex.channelIDs:\n%s", out)
		}
		out, _, err = runAllocate(t, "--size", "1", "--proc-root", procRoot(t, true))
		if err != nil || strings.Contains(out, "IMEX") {
			t.Errorf("table: %v\n%s", err, out)
		}
	})
}
