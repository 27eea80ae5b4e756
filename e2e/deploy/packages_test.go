package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/config"
)

// testPackageVersion is what tools/pkgbuild makes of testVersion: a
// pre-release, ordered before 9.8.7 by dpkg and rpm alike.
const testPackageVersion = "9.8.7~e2e"

// packaged are the files every package installs; the last two are conffiles.
var packaged = []string{
	"/usr/bin/gpu-device-plugin",
	"/usr/lib/systemd/system/gpu-device-plugin.service",
	"/etc/gpu-device-plugin/config.yaml",
	"/etc/default/gpu-device-plugin",
}

func buildPackages(t *testing.T) (deb, rpm string) {
	t.Helper()
	bin := filepath.Join(shared, "packages")
	runMake(t, "packages", "BIN="+bin, "VERSION="+testVersion, "COMMIT="+testCommit, "SOURCE_DATE_EPOCH="+testEpoch)
	debs, _ := filepath.Glob(filepath.Join(bin, "*.deb"))
	rpms, _ := filepath.Glob(filepath.Join(bin, "*.rpm"))
	if len(debs) != 1 || len(rpms) != 1 {
		t.Fatalf("make packages wrote %q and %q, want one .deb and one .rpm", debs, rpms)
	}
	return debs[0], rpms[0]
}

func TestPackages(t *testing.T) {
	deb, rpm := buildPackages(t)
	if !strings.Contains(filepath.Base(deb), testPackageVersion) || !strings.Contains(filepath.Base(rpm), testPackageVersion) {
		t.Errorf("package names %s, %s do not carry version %s", filepath.Base(deb), filepath.Base(rpm), testPackageVersion)
	}
	t.Run("deb contents", func(t *testing.T) { testDebContents(t, deb) })
	t.Run("rpm contents", func(t *testing.T) { testRPMContents(t, rpm) })
	t.Run("shipped config accepted", func(t *testing.T) {
		if _, err := config.Load(repoPath(t, "packaging", "config.yaml")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("dpkg install and purge", func(t *testing.T) { testDebInstall(t, deb) })
}

func testDebContents(t *testing.T, deb string) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb is not installed")
	}
	field := func(name string) string {
		out, err := exec.Command("dpkg-deb", "-f", deb, name).Output()
		if err != nil {
			t.Fatalf("dpkg-deb -f %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	if v := field("Version"); v != testPackageVersion+"-1" {
		t.Errorf("Version %q, want %s-1", v, testPackageVersion)
	}
	if d := field("Depends"); !strings.HasPrefix(d, "libc6 (>= 2.") {
		t.Errorf("Depends %q, want libc6 (>= the glibc the binary needs)", d)
	}
	out, err := exec.Command("dpkg-deb", "-c", deb).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range packaged {
		if !bytes.Contains(out, []byte(" ."+p+"\n")) {
			t.Errorf("the .deb has no %s:\n%s", p, out)
		}
	}
	conffiles, err := exec.Command("dpkg-deb", "-I", deb, "conffiles").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(conffiles)); !slices.Equal(sorted(got), sorted(packaged[2:])) {
		t.Errorf("conffiles %q, want %q", got, packaged[2:])
	}
}

func testRPMContents(t *testing.T, rpm string) {
	b := mustRead(t, rpm)
	if !bytes.HasPrefix(b, []byte{0xed, 0xab, 0xee, 0xdb}) {
		t.Fatalf("%s does not start with the RPM lead", rpm)
	}
	if _, err := exec.LookPath("rpm"); err != nil {
		t.Skip("rpm is not installed; checked the RPM lead only")
	}
	q := func(args ...string) string {
		out, err := exec.Command("rpm", append([]string{"-qp", "--nosignature"}, append(args, rpm)...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("rpm -qp %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if v := q("--queryformat", "%{VERSION}-%{RELEASE}"); v != testPackageVersion+"-1" {
		t.Errorf("rpm version %q, want %s-1", v, testPackageVersion)
	}
	if got := strings.Fields(q("--configfiles")); !slices.Equal(sorted(got), sorted(packaged[2:])) {
		t.Errorf("rpm config files %q, want %q", got, packaged[2:])
	}
	list := q("-l")
	for _, p := range packaged {
		if !strings.Contains(list, p+"\n") {
			t.Errorf("the .rpm has no %s:\n%s", p, list)
		}
	}
	if req := q("--requires"); !strings.Contains(req, "glibc >= 2.") {
		t.Errorf("rpm requires no glibc version:\n%s", req)
	}
}

// testDebInstall installs the .deb on this machine, runs what it
// installed, and purges it, leaving nothing behind.
func testDebInstall(t *testing.T, deb string) {
	if !isRoot() {
		t.Skip("installing a package needs root")
	}
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("dpkg is not installed (not a Debian-family machine)")
	}
	if v, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "gpu-device-plugin").Output(); err == nil {
		if string(v) != testPackageVersion+"-1" {
			t.Skipf("gpu-device-plugin %s is installed here; not touching it", v)
		}
		// Left behind by a run of this test that was killed.
		if out, err := exec.Command("dpkg", "--purge", "gpu-device-plugin").CombinedOutput(); err != nil {
			t.Fatalf("purging a left-over test install: %v\n%s", err, out)
		}
	}
	for _, p := range packaged {
		if _, err := os.Stat(p); err == nil {
			t.Skipf("%s already exists here; not touching it", p)
		}
	}
	dpkg := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("dpkg", args...).CombinedOutput(); err != nil {
			t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	dpkg("-i", deb)
	purged := false
	t.Cleanup(func() {
		if !purged {
			exec.Command("dpkg", "--purge", "gpu-device-plugin").Run()
		}
	})

	out, err := exec.Command("/usr/bin/gpu-device-plugin", "version", "--config=/etc/gpu-device-plugin/config.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("installed gpu-device-plugin version: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "gpu-device-plugin "+testVersion+"\n") || !strings.Contains(string(out), "commit:  "+testCommit+"\n") {
		t.Errorf("installed binary is not stamped with %s %s:\n%s", testVersion, testCommit, out)
	}

	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze is not installed: the unit was not verified")
	} else {
		out, err := exec.Command("systemd-analyze", "verify", "/usr/lib/systemd/system/gpu-device-plugin.service").CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}

	dpkg("--purge", "gpu-device-plugin")
	purged = true
	for _, p := range append(packaged, "/etc/gpu-device-plugin") {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s is still there after dpkg --purge", p)
		}
	}
}

func sorted(xs []string) []string {
	ys := slices.Clone(xs)
	slices.Sort(ys)
	return ys
}
