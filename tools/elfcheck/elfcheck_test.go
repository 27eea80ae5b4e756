package elfcheck

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The hook runs on the host, whatever its libc: the image and the packages refuse one
// that needs a dynamic loader or is for another architecture than the
// plugin.
func TestStatic(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"main.go": "package main\n\nfunc main() { println(\"hook\") }\n",
		"go.mod":  "module example.com/hook\n\ngo 1.21\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	static := filepath.Join(dir, "hook")
	build := exec.Command("go", "build", "-o", static, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building a static stand-in for the hook: %v\n%s", err, out)
	}
	arch := runtime.GOARCH
	other := "arm64"
	if arch == other {
		other = "amd64"
	}

	type tc struct{ name, binary, arch, wantErr string }
	cases := []tc{
		{"static for the plugin's architecture", static, arch, ""},
		{"another architecture", static, other, "the plugin for " + other},
		{"missing", filepath.Join(dir, "nothing"), arch, "make build"},
	}
	if dynamic, err := exec.LookPath("true"); err == nil {
		if f, err := elf.Open(dynamic); err == nil {
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					cases = append(cases, tc{"dynamically linked", dynamic, goarch[f.Machine], "CGO_ENABLED=0"})
					break
				}
			}
			f.Close()
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Static(c.binary, c.arch)
			if c.wantErr == "" && err != nil {
				t.Fatalf("Static: %v", err)
			}
			if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("Static: %v, want an error containing %q", err, c.wantErr)
			}
		})
	}
}
