package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestPackageVersion(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"release tag", "v1.2.3", "1.2.3"},
		{"tag without v", "0.4.0", "0.4.0"},
		{"commits after a tag sort after it", "v1.2.3-4-gabc1234", "1.2.3+4.gabc1234"},
		{"dirty tree after a tag", "v1.2.3-4-gabc1234-dirty", "1.2.3+4.gabc1234.dirty"},
		{"dirty tree on a tag", "v1.2.3-dirty", "1.2.3+dirty"},
		{"pre-release sorts before the release", "v1.3.0-rc.1", "1.3.0~rc.1"},
		{"bare commit", "abc1234", "0.0.0+git.abc1234"},
		{"bare commit starting with digits", "89460c5-dirty", "0.0.0+git.89460c5.dirty"},
		{"no git", "dev", "0.0.0+git.dev"},
		{"odd characters", "feature/x_y", "0.0.0+git.feature.x.y"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PackageVersion(tc.in); got != tc.want {
				t.Errorf("PackageVersion(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestNewestGLIBC(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []string
		want string
	}{
		{"numeric order, not string order", []string{"GLIBC_2.3.2", "GLIBC_2.34", "GLIBC_2.4", "GLIBC_2.32"}, "2.34"},
		{"private and other libraries ignored", []string{"GLIBC_PRIVATE", "GCC_3.0", "", "GLIBC_2.2.5"}, "2.2.5"},
		{"static binary", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NewestGLIBC(tc.in); got != tc.want {
				t.Errorf("NewestGLIBC(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// The hook runs on the host, whatever its libc: the packages refuse one
// that needs a dynamic loader or is for another architecture than the
// plugin.
func TestCheckStatic(t *testing.T) {
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
	arch, _, err := binaryFacts(static)
	if err != nil {
		t.Fatal(err)
	}
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
					cases = append(cases, tc{"dynamically linked", dynamic, goarchOf[f.Machine], "CGO_ENABLED=0"})
					break
				}
			}
			f.Close()
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckStatic(c.binary, c.arch)
			if c.wantErr == "" && err != nil {
				t.Fatalf("CheckStatic: %v", err)
			}
			if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("CheckStatic: %v, want an error containing %q", err, c.wantErr)
			}
		})
	}
}
