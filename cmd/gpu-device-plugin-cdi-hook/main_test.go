package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		stdin  string
		code   int
		stderr string // a substring
	}{
		{name: "no command", code: 2, stderr: "usage:"},
		{name: "unknown command", args: []string{"prestart"}, code: 2, stderr: `unknown command "prestart"`},
		{name: "link without separator", args: []string{"create-container", "--link", "libcuda.so.1:/usr/lib64/libcuda.so"}, code: 2,
			stderr: `invalid value "libcuda.so.1:/usr/lib64/libcuda.so" for flag -link`},
		{name: "relative folder", args: []string{"create-container", "--folder", "usr/lib64"}, code: 2,
			stderr: `invalid value "usr/lib64" for flag -folder: "usr/lib64": must be an absolute path`},
		{name: "positional argument", args: []string{"create-container", "/usr/lib64"}, code: 2, stderr: `unexpected argument "/usr/lib64"`},
		{name: "install without dir", args: []string{"install"}, code: 2, stderr: "--dir is required"},
		{name: "bad state", args: []string{"create-container", "--folder", "/usr/lib64"}, stdin: `{"bundle":`, code: 1,
			stderr: "create-container: container state on stdin"},
		{name: "version", args: []string{"version"}, code: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tc.args, strings.NewReader(tc.stdin), &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.stderr) {
				t.Fatalf("exit %d, want %d; stderr %q, want it to contain %q", code, tc.code, stderr.String(), tc.stderr)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	var stdout bytes.Buffer
	run(context.Background(), []string{"version"}, strings.NewReader(""), &stdout, &stdout)
	if !strings.HasPrefix(stdout.String(), "gpu-device-plugin-cdi-hook dev\n") {
		t.Fatalf("version printed %q", stdout.String())
	}
}
