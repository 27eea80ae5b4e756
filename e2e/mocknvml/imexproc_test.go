package mocknvml

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A profile with a GPU in an NVLink domain lists the IMEX channels'
// major in /proc/devices, as a driver with IMEX support does; others
// do not.
func TestWriteProcIMEXMajor(t *testing.T) {
	for _, tc := range []struct {
		profile string
		want    bool
	}{{"gb200-tray", true}, {"gb200-split", true}, {"dgx-h100", false}} {
		t.Run(tc.profile, func(t *testing.T) {
			p, err := LoadProfile(filepath.Join("..", "profiles", tc.profile+".profile"))
			if err != nil {
				t.Fatalf("profile %s: %v", tc.profile, err)
			}
			proc := t.TempDir()
			if err := p.WriteProc(proc); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(filepath.Join(proc, "devices"))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(string(data), "  1 nvidia-caps-imex-channels\n"); got != tc.want {
				t.Errorf("devices lists IMEX: %t, want %t:\n%s", got, tc.want, data)
			}
		})
	}
}
