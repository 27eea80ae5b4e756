package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
)

func testRun(plugin string, regMs, a1, a1p99, rss float64) sideRun {
	return sideRun{
		Plugin: plugin, Devices: 1, RegisteredMs: regMs,
		Allocate:            []harness.Latency{{Size: 1, Calls: 10, P50Us: a1, P99Us: a1p99}},
		PreferredAllocation: []harness.Latency{{Size: 1, Calls: 10, P50Us: a1 / 2, P99Us: a1p99 / 2}},
		RSSMiB:              rss,
	}
}

func TestSideTable(t *testing.T) {
	tests := []struct {
		name string
		runs []sideRun
		want []sideRow
	}{
		{
			name: "medians of two runs each, ratio ours over NVIDIA's",
			runs: []sideRun{
				testRun(ours, 40, 100, 300, 20), testRun(nvidia, 80, 200, 400, 30),
				testRun(ours, 60, 140, 500, 22), testRun(nvidia, 120, 200, 600, 34),
			},
			want: []sideRow{
				{"registration", "ms", 50, 100, 0.5},
				{"Allocate of 1 p50", "µs", 120, 200, 0.6},
				{"Allocate of 1 p99", "µs", 400, 500, 0.8},
				{"GetPreferredAllocation of 1 p50", "µs", 60, 100, 0.6},
				{"GetPreferredAllocation of 1 p99", "µs", 200, 250, 0.8},
				{"RSS after idle", "MiB", 21, 32, 0.66},
			},
		},
		{
			name: "an odd count takes the middle run",
			runs: []sideRun{
				{Plugin: ours, RegisteredMs: 10}, {Plugin: nvidia, RegisteredMs: 30},
				{Plugin: ours, RegisteredMs: 90}, {Plugin: nvidia, RegisteredMs: 10},
				{Plugin: ours, RegisteredMs: 20}, {Plugin: nvidia, RegisteredMs: 20},
			},
			want: []sideRow{{"registration", "ms", 20, 20, 1}},
		},
		{
			name: "a failed run counts only for what it measured",
			runs: []sideRun{
				testRun(ours, 40, 100, 300, 20),
				{Plugin: nvidia, RegisteredMs: 80, Error: "GetPreferredAllocation of 1: unimplemented"},
				testRun(ours, 40, 100, 300, 20),
				testRun(nvidia, 40, 50, 150, 40),
			},
			want: []sideRow{
				{"registration", "ms", 40, 60, 0.67},
				{"Allocate of 1 p50", "µs", 100, 50, 2},
				{"Allocate of 1 p99", "µs", 300, 150, 2},
				{"GetPreferredAllocation of 1 p50", "µs", 50, 25, 2},
				{"GetPreferredAllocation of 1 p99", "µs", 150, 75, 2},
				{"RSS after idle", "MiB", 20, 40, 0.5},
			},
		},
		{
			name: "no row without NVIDIA's figure",
			runs: []sideRun{testRun(ours, 40, 100, 300, 20), {Plugin: nvidia, Error: "exec format error"}},
		},
		{
			name: "sizes only one side served are left out",
			runs: []sideRun{
				{Plugin: ours, Allocate: []harness.Latency{{Size: 1, P50Us: 10, P99Us: 20}, {Size: 4, P50Us: 10, P99Us: 20}}},
				{Plugin: nvidia, Allocate: []harness.Latency{{Size: 1, P50Us: 20, P99Us: 20}, {Size: 3, P50Us: 10, P99Us: 20}}},
			},
			want: []sideRow{{"Allocate of 1 p50", "µs", 10, 20, 0.5}, {"Allocate of 1 p99", "µs", 20, 20, 1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sideTable(tt.runs); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("sideTable =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func TestSideBySideNotes(t *testing.T) {
	sb := &sideBySide{NVIDIAVersion: "v0.19.1", Table: []sideRow{
		{"registration", "ms", 51.07, 36.98, 1.38},
		{"GetPreferredAllocation of 4 p99", "µs", 755.4, 1200.8, 0.63},
	}}
	want := []string{
		"side by side with NVIDIA's device plugin v0.19.1, 2 runs each in turn, medians, ratio ours/NVIDIA's:",
		"                                               ours   NVIDIA's  ratio",
		"  registration (ms)                            51.1       37.0   1.38",
		"  GetPreferredAllocation of 4 p99 (µs)        755.4     1200.8   0.63",
	}
	if got := sb.notes(2); !reflect.DeepEqual(got, want) {
		t.Errorf("notes =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	skipped := &sideBySide{Skipped: "NVIDIA's device plugin is not in the bundle (/b/nvidia-device-plugin); make gpu-check-bundle builds it where the Go module proxy answers"}
	got := skipped.notes(2)
	if len(got) != 1 || !strings.Contains(got[0], "none; NVIDIA's device plugin is not in the bundle") {
		t.Errorf("notes without NVIDIA's plugin = %q, want one line saying why", got)
	}
	if got := (*sideBySide)(nil).notes(2); got != nil {
		t.Errorf("notes of no comparison = %q, want none", got)
	}
}

// The comparison's keys, as report.json carries them.
func TestSideBySideKeys(t *testing.T) {
	sb := sideBySide{NVIDIAVersion: "v0.19.1", Skipped: "x",
		Runs:  []sideRun{{Plugin: ours, Error: "e"}},
		Table: []sideRow{{"registration", "ms", 1, 2, 0.5}}}
	b, err := json.Marshal(sb)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"nvidiaVersion":"v0.19.1","skipped":"x",` +
		`"runs":[{"plugin":"ours","devices":0,"registeredMs":0,"allocate":null,"preferredAllocation":null,"rssMiB":0,"peakRSSMiB":0,"error":"e"}],` +
		`"table":[{"figure":"registration","unit":"ms","ours":1,"nvidia":2,"ratio":0.5}]}`
	if string(b) != want {
		t.Errorf("JSON =\n%s\nwant\n%s", b, want)
	}
}
