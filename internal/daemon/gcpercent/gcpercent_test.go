package gcpercent

import (
	"runtime/debug"
	"testing"
)

func TestTune(t *testing.T) {
	tests := []struct {
		name        string
		env         map[string]string
		wantGOGC    string
		wantPercent int
	}{
		{name: "unset GOGC gets the serve default", env: nil, wantGOGC: "50", wantPercent: Serve},
		{name: "empty GOGC is unset", env: map[string]string{"GOGC": ""}, wantGOGC: "50", wantPercent: Serve},
		{name: "the user's GOGC is kept", env: map[string]string{"GOGC": "200"}, wantGOGC: "200", wantPercent: 100},
		{name: "GOGC=off is kept", env: map[string]string{"GOGC": "off"}, wantGOGC: "off", wantPercent: 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The process's own setting stands in for what the runtime read
			// from the environment; restored after the case.
			prev := debug.SetGCPercent(100)
			defer debug.SetGCPercent(prev)
			got := Tune(func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok })
			if got != tt.wantGOGC {
				t.Errorf("Tune = %q, want %q", got, tt.wantGOGC)
			}
			if p := debug.SetGCPercent(100); p != tt.wantPercent {
				t.Errorf("GC percent after Tune = %d, want %d", p, tt.wantPercent)
			}
		})
	}
}
