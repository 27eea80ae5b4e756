package health

import "testing"

func TestDescribe(t *testing.T) {
	for reason, want := range map[string]string{
		"":                              "",
		"xid=79":                        "xid=79: fallen off the bus",
		"recovery-action=reset, xid=48": "recovery-action=reset, xid=48: double-bit ECC error",
		"xid=9999":                      "xid=9999",
		"gpu-lost":                      "gpu-lost",
		"xid=x":                         "xid=x",
	} {
		if got := Describe(reason); got != want {
			t.Errorf("Describe(%q) = %q, want %q", reason, got, want)
		}
	}
}
