package main

import (
	"strings"
	"testing"
)

// mps-exec is the plugin's own helper: hidden from help and from the
// commands a stray word is told about, and a bad spec is a one-line error.
func TestMPSExecHidden(t *testing.T) {
	out, _, err := run(t, mockOpen, "--help")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "mps-exec") {
		t.Errorf("help lists the hidden mps-exec:\n%s", out)
	}
	_, _, err = run(t, mockOpen, "lst")
	if err == nil || strings.Contains(err.Error(), "mps-exec") {
		t.Errorf("err = %v; want the commands without mps-exec", err)
	}
	for _, arg := range []string{"{", "--help"} {
		_, _, err = run(t, mockOpen, "mps-exec", arg)
		if err == nil || !strings.Contains(err.Error(), "mps-exec spec: not a valid spec") || strings.Contains(err.Error(), "\n") {
			t.Errorf("mps-exec %s: err = %v; want one line saying the spec is not valid", arg, err)
		}
	}
}
