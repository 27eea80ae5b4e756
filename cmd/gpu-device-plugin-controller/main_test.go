package main

import (
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no namespace", []string{"--namespace="}, "POD_NAMESPACE"},
		{"short node timeout", []string{"--namespace=gpu", "--node-timeout=1s"}, "--node-timeout"},
		{"short lease", []string{"--namespace=gpu", "--lease-duration=1s"}, "--lease-duration"},
		{"an argument", []string{"--namespace=gpu", "compute-domain-controller"}, `unexpected argument "compute-domain-controller"`},
		{"unknown flag", []string{"--namespace=gpu", "--loud"}, "loud"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sink strings.Builder
			if _, err := parseFlags(tc.args, &sink); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one with %q", err, tc.want)
			}
		})
	}
	var sink strings.Builder
	f, err := parseFlags([]string{"--namespace=gpu", "--lease-name=l"}, &sink)
	if err != nil || f.namespace != "gpu" || f.leaseName != "l" || f.nodeTimeout != 2*time.Minute {
		t.Errorf("got %+v %v", f, err)
	}
}

// --help prints the flags and is no failure.
func TestHelp(t *testing.T) {
	var out strings.Builder
	if _, err := parseFlags([]string{"--help"}, &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "-lease-name") {
		t.Errorf("err = %v, output %q", err, out.String())
	}
}
