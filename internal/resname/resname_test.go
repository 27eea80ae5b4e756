package resname

import "testing"

func TestMIG(t *testing.T) {
	for profile, want := range map[string]string{
		"1g.10gb": "nvidia.com/mig-1g.10gb", "1g.10gb+me": "nvidia.com/mig-1g.10gb.me", "1c.3g.40gb": "nvidia.com/mig-1c.3g.40gb",
	} {
		if got := MIG(profile); got != want {
			t.Errorf("MIG(%q) = %q, want %q", profile, got, want)
		}
	}
}
