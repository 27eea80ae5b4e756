package main

import (
	"strings"
	"testing"
)

// A build stamped by make prints its semantic version on the first line,
// the commit on the second.
func TestVersionFirstLine(t *testing.T) {
	for _, tc := range []struct{ name, version, commit string }{
		{"a release", "v0.1.0", "4c3f594"},
		{"a build between releases", "v0.1.0+4c3f594.dirty", "4c3f594"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(v, c string) { version, commit = v, c }(version, commit)
			version, commit = tc.version, tc.commit
			out, _, err := run(t, noDriver, "version")
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(out, "\n")
			if len(lines) < 2 || lines[0] != "gpu-device-plugin "+tc.version || lines[1] != "commit:  "+tc.commit {
				t.Errorf("version prints\n%s\nwant first gpu-device-plugin %s, then commit:  %s", out, tc.version, tc.commit)
			}
		})
	}
}
