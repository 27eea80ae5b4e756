package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// crossStandIn is make's view of a cross toolchain that is there: a
// compiler that exists (true(1)) and a sysroot with a libc.
func crossStandIn(t *testing.T) []string {
	t.Helper()
	sysroot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(sysroot, "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeBytes(t, filepath.Join(sysroot, "lib/libc.so"), nil)
	// The build machine is amd64 here, whatever runs the test.
	return []string{"GOHOSTARCH=amd64", "CROSS_CC_arm64=true", "CROSS_SYSROOT_arm64=" + sysroot}
}

var (
	goBuildArch = regexp.MustCompile(`GOARCH=(\S+)`)
	sysrootFlag = regexp.MustCompile(`-sysroot (\S+)`)
)

// make release gives one version to every binary of every architecture,
// to imagebuild, pkgbuild and releasebuild; builds arm64's cgo binaries
// with the cross compiler and its image from the cross libc.
func TestMakeReleaseStampsOneVersion(t *testing.T) {
	const v = "v9.9.9-test"
	cross := crossStandIn(t)
	out := makeCmd(t, root, append([]string{"-n", "release", "VERSION=" + v, "BIN=" + t.TempDir()}, cross...)...)
	sourced := sourcedBinaries(t)
	builds := map[string][]string{} // arch → ./cmd/ packages
	tools := map[string]int{}
	for _, line := range strings.Split(strings.ReplaceAll(out, "\\\n", " "), "\n") {
		switch {
		case strings.Contains(line, " build ") && strings.Contains(line, "./cmd/"):
			pkg := line[strings.LastIndex(line, "./cmd/"):]
			arch := goBuildArch.FindStringSubmatch(line)
			if arch == nil {
				t.Errorf("built without GOARCH: %s", line)
				continue
			}
			builds[arch[1]] = append(builds[arch[1]], pkg)
			if m := ldflagsVersion.FindStringSubmatch(line); m == nil || m[1] != v || !strings.Contains(line, "-X main.commit=") {
				t.Errorf("not stamped %s and a commit: %s", v, line)
			}
			hook := strings.HasSuffix(pkg, "/"+HookBinary)
			if hook != strings.Contains(line, "CGO_ENABLED=0") {
				t.Errorf("only the hook is static (CGO_ENABLED=0): %s", line)
			}
			if cc := strings.Contains(line, "CC=true"); cc != (arch[1] == "arm64" && !hook) {
				t.Errorf("arm64's cgo binaries, and they only, take the cross compiler: %s", line)
			}
		case releaseTool(line) != "":
			tool := releaseTool(line)
			tools[tool]++
			if m := toolVersion.FindStringSubmatch(line); m == nil || m[1] != v {
				t.Errorf("%s not given -version '%s': %s", tool, v, line)
			}
			if tool != "releasebuild" {
				for _, p := range toolBinaryProblems(line, sourced) {
					t.Errorf("%s: %s: %s", tool, p, line)
				}
			}
			if tool == "imagebuild" {
				s := sysrootFlag.FindStringSubmatch(line)
				arm := strings.Contains(line, "linux-arm64/")
				if s == nil || (arm && s[1] == "/") || (!arm && s[1] != "/") {
					t.Errorf("imagebuild's -sysroot: / for amd64, the cross libc's for arm64: %s", line)
				}
			}
			if tool == "releasebuild" && !strings.Contains(line, "-platforms 'linux/amd64,linux/arm64'") {
				t.Errorf("releasebuild not given both platforms: %s", line)
			}
		}
	}
	cmds, _ := filepath.Glob(filepath.Join(root, "cmd", "*"))
	var want []string
	for _, c := range cmds {
		want = append(want, "./cmd/"+filepath.Base(c))
	}
	for _, arch := range []string{"amd64", "arm64"} {
		got := slices.Clone(builds[arch])
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("make release builds %v for %s, want %v", got, arch, want)
		}
	}
	if tools["imagebuild"] != 2 || tools["pkgbuild"] != 2 || tools["releasebuild"] != 1 {
		t.Errorf("runs %v; want imagebuild and pkgbuild per architecture, releasebuild once:\n%s", tools, out)
	}
}

// releaseTool is the release tool a recipe line runs, if any.
func releaseTool(line string) string {
	for _, f := range strings.Fields(line) {
		if b := filepath.Base(f); strings.Contains(f, "/") && !strings.HasPrefix(f, "./") && slices.Contains([]string{"imagebuild", "pkgbuild", "releasebuild"}, b) {
			return b
		}
	}
	return ""
}

// make push sends the release for VERSION, or make image's tarball when
// IMAGE has a tag.
func TestMakePush(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		wants []string
	}{
		{"a repository: the release", []string{"IMAGE=r.example/team/gpu-device-plugin", "VERSION=v9.9.9-test"},
			[]string{"./releasebuild push -version 'v9.9.9-test'", "-image 'r.example/team/gpu-device-plugin' -charts 'r.example/team/charts'", "-platforms 'linux/amd64,linux/arm64'", "/release/v9.9.9-test"}},
		{"CHARTS elsewhere", []string{"IMAGE=r.example/team/gpu-device-plugin", "CHARTS=c.example/helm", "VERSION=v9.9.9-test"},
			[]string{"-charts 'c.example/helm'"}},
		{"a tag: make image's tarball", []string{"IMAGE=localhost:5000/gpu-device-plugin:dev"},
			[]string{"./imagebuild push -tarball", "-image 'localhost:5000/gpu-device-plugin:dev'"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := strings.ReplaceAll(makeCmd(t, root, append([]string{"-n", "push"}, tc.args...)...), "\\\n\t\t", "")
			for _, w := range tc.wants {
				if !strings.Contains(out, w) {
					t.Errorf("make -n push %s does not run %q:\n%s", strings.Join(tc.args, " "), w, out)
				}
			}
		})
	}
}

// Without the cross compiler, make release stops at once with one line
// saying what to install, and builds nothing.
func TestMakeReleaseWithoutCrossCompiler(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	bin := t.TempDir()
	for _, tc := range []struct{ name, arg, want string }{
		{"no compiler", "CROSS_CC_arm64=no-such-gcc-for-the-test", "apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross"},
		{"no libc", "CROSS_SYSROOT_arm64=" + filepath.Join(bin, "no-sysroot"), "apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross"},
		{"no v", "VERSION=9.9.9", "VERSION=9.9.9 is not v and a semantic version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"-C", root, "--no-print-directory", "release", "GOHOSTARCH=amd64", "CROSS_CC_arm64=true", "BIN=" + bin, "VERSION=v9.9.9-test", tc.arg}
			cmd := exec.Command("make", args...)
			cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
				k, _, _ := strings.Cut(kv, "=")
				return slices.Contains([]string{"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"}, k)
			})
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("make release passed:\n%s", out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Errorf("make release said\n%s\nwant one line with %q", out, tc.want)
			}
			if entries, _ := os.ReadDir(bin); len(entries) > 0 {
				t.Errorf("make release wrote %v before refusing", entries)
			}
		})
	}
}

// toolFlag is the flag imagebuild and pkgbuild take a binary of Binaries
// by: -binary, -dp, -dra, -controller, -hook.
func toolFlag(binary string) string {
	switch binary {
	case Name:
		return "-binary"
	case HookBinary:
		return "-hook"
	}
	return "-" + strings.TrimPrefix(binary, Name+"-")
}

// sourcedBinaries are the binaries of Binaries whose cmd/ package this
// tree has: those make can build and must hand to imagebuild and pkgbuild.
func sourcedBinaries(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, b := range Binaries() {
		if _, err := os.Stat(filepath.Join(root, "cmd", b)); err == nil {
			out = append(out, b)
		} else {
			t.Logf("no cmd/%s in this tree: make is not asked to pass %s yet", b, toolFlag(b))
		}
	}
	return out
}

// toolBinaryProblems says what an imagebuild or pkgbuild command line of
// make -n gets wrong about binaries: each must be given by its flag, as a
// file of its own name, and all from one folder (make's build of one
// platform); else the tool falls back on its default, bin/<binary>, which
// may be another build or another architecture's.
func toolBinaryProblems(line string, binaries []string) []string {
	fields := strings.Fields(line)
	var problems []string
	var dirs []string
	for _, b := range binaries {
		flag := toolFlag(b)
		i := slices.Index(fields, flag)
		if i < 0 || i+1 >= len(fields) {
			problems = append(problems, "not given "+flag)
			continue
		}
		p := strings.Trim(fields[i+1], `'"`)
		if filepath.Base(p) != b {
			problems = append(problems, flag+" "+p+" is not a "+b)
		}
		if d := filepath.Dir(p); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	if len(dirs) > 1 {
		problems = append(problems, "binaries from more than one folder: "+strings.Join(dirs, ", "))
	}
	return problems
}

func TestToolBinaryProblems(t *testing.T) {
	all := Binaries()
	line := func(dp string) string {
		return "imagebuild -sysroot / -binary /w/linux-amd64/gpu-device-plugin " + dp +
			" -dra /w/linux-amd64/gpu-device-plugin-dra -controller /w/linux-amd64/gpu-device-plugin-controller" +
			" -hook /w/linux-amd64/gpu-device-plugin-cdi-hook -version 'v1.0.0'"
	}
	for _, tc := range []struct {
		name, line string
		want       []string
	}{
		{"every binary, one folder", line("-dp /w/linux-amd64/gpu-device-plugin-dp"), nil},
		{"no -dp", line(""), []string{"not given -dp"}},
		{"-dp from elsewhere", line("-dp /bin/gpu-device-plugin-dp"), []string{"binaries from more than one folder: /w/linux-amd64, /bin"}},
		{"-dp given the DRA executable", line("-dp /w/linux-amd64/gpu-device-plugin-dra"),
			[]string{"-dp /w/linux-amd64/gpu-device-plugin-dra is not a gpu-device-plugin-dp"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := toolBinaryProblems(tc.line, all); !slices.Equal(got, tc.want) {
				t.Errorf("problems %q, want %q", got, tc.want)
			}
		})
	}
}
