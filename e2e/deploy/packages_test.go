package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// testPackageVersion is what tools/pkgbuild makes of testVersion: a
// pre-release, ordered before 9.8.7 by dpkg and rpm alike.
const testPackageVersion = "9.8.7~e2e"

// packaged are the files every package installs, conffiles the ones of
// them a package upgrade leaves alone once edited.
var (
	packaged = []string{
		"/usr/bin/gpu-device-plugin",
		packageDPPath,
		packageDRAPath,
		packageControllerPath,
		packageHookPath,
		"/usr/lib/systemd/system/gpu-device-plugin.service",
		"/etc/gpu-device-plugin/config.yaml",
		"/etc/default/gpu-device-plugin",
	}
	conffiles = []string{
		"/etc/gpu-device-plugin/config.yaml",
		"/etc/default/gpu-device-plugin",
	}
)

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

// postremove.sh removes the plugin's CDI specs when the package goes away
// (deb remove or purge, rpm 0), and keeps them on an upgrade, which
// restarts a plugin that still serves them. Other vendors' specs stay.
func TestPostremoveScript(t *testing.T) {
	if !isRoot() {
		t.Skip("a private /run needs root")
	}
	if _, err := exec.LookPath("mount"); err != nil {
		t.Skip("mount is not installed")
	}
	script := repoPath(t, "packaging", "scripts", "postremove.sh")
	const all = "gpu-device-plugin_x.json gpu-device-plugin_y.yaml nvidia.yaml"
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"deb remove", []string{"remove"}, "nvidia.yaml"},
		{"deb purge", []string{"purge"}, "nvidia.yaml"},
		{"rpm erase", []string{"0"}, "nvidia.yaml"},
		{"deb upgrade keeps them", []string{"upgrade", "1.0.0-1"}, all},
		{"deb failed upgrade keeps them", []string{"failed-upgrade", "1.0.0-1"}, all},
		{"rpm upgrade keeps them", []string{"1"}, all},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := inPrivateRun(t, `
mkdir -p /var/run/cdi
touch /var/run/cdi/gpu-device-plugin_x.json /var/run/cdi/gpu-device-plugin_y.yaml /var/run/cdi/nvidia.yaml
script=$1; shift
sh "$script" "$@"
echo "left: $(cd /var/run/cdi && echo *)"
`, append([]string{script}, tc.args...)...)
			if err != nil {
				t.Fatalf("postremove.sh %s: %v\n%s", strings.Join(tc.args, " "), err, out)
			}
			if want := "left: " + tc.want + "\n"; !strings.Contains(out, want) {
				t.Errorf("postremove.sh %s: want %q\n%s", strings.Join(tc.args, " "), want, out)
			}
		})
	}
	t.Run("no spec directory", func(t *testing.T) {
		if out, err := inPrivateRun(t, `sh "$1" remove`, script); err != nil {
			t.Errorf("postremove.sh remove without /var/run/cdi: %v\n%s", err, out)
		}
	})
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
	// The hook is executable by all: the container runtime runs it. So are
	// the daemons, which the plugin execs, and the controller.
	for _, p := range []string{packageHookPath, packageDPPath, packageDRAPath, packageControllerPath} {
		if !regexp.MustCompile(`(?m)^-rwxr-xr-x .* \.` + regexp.QuoteMeta(p) + `$`).Match(out) {
			t.Errorf("the .deb's %s is not -rwxr-xr-x:\n%s", p, out)
		}
	}
	confs, err := exec.Command("dpkg-deb", "-I", deb, "conffiles").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(confs)); !slices.Equal(sorted(got), sorted(conffiles)) {
		t.Errorf("conffiles %q, want %q", got, conffiles)
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
	if got := strings.Fields(q("--configfiles")); !slices.Equal(sorted(got), sorted(conffiles)) {
		t.Errorf("rpm config files %q, want %q", got, conffiles)
	}
	list := q("-l")
	for _, p := range append(packaged, filepath.Dir(packageHookPath)) {
		if !strings.Contains(list, p+"\n") {
			t.Errorf("the .rpm has no %s:\n%s", p, list)
		}
	}
	if req := q("--requires"); !strings.Contains(req, "glibc >= 2.") {
		t.Errorf("rpm requires no glibc version:\n%s", req)
	}
}

// testDebInstall installs the .deb on this machine, runs what it
// installed, and purges it, leaving nothing behind. Every removal runs with
// a private /run (inPrivateRun): the package's postrm removes the plugin's
// CDI specs, and this machine's own must not be touched.
func testDebInstall(t *testing.T, deb string) {
	if !isRoot() {
		t.Skip("installing a package needs root")
	}
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("dpkg is not installed (not a Debian-family machine)")
	}
	if _, err := exec.LookPath("mount"); err != nil {
		t.Skip("mount is not installed: no private /run for removing the package")
	}
	if v, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "gpu-device-plugin").Output(); err == nil {
		if string(v) != testPackageVersion+"-1" {
			t.Skipf("gpu-device-plugin %s is installed here; not touching it", v)
		}
		// Left behind by a run of this test that was killed.
		if out, err := inPrivateRun(t, "dpkg --purge gpu-device-plugin"); err != nil {
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
			inPrivateRun(t, "dpkg --purge gpu-device-plugin")
		}
	})

	out, err := exec.Command("/usr/bin/gpu-device-plugin", "version", "--config=/etc/gpu-device-plugin/config.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("installed gpu-device-plugin version: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "gpu-device-plugin "+testVersion+"\n") || !strings.Contains(string(out), "commit:  "+testCommit+"\n") {
		t.Errorf("installed binary is not stamped with %s %s:\n%s", testVersion, testCommit, out)
	}

	// The installed plugin in DRA mode becomes gpu-device-plugin-dra,
	// found beside it: $PATH is empty.
	if filepath.Dir(packageDRAPath) != filepath.Dir(packaged[0]) {
		t.Errorf("the package installs %s, not beside %s", packageDRAPath, packaged[0])
	}
	draDir := t.TempDir()
	draOut, err := runServe(t, packaged[0], t.TempDir(), draDir)
	checkHandedOver(t, draOut, err, draDir)
	// In device-plugin mode, gpu-device-plugin-dp beside it.
	if exe, out := serveUntilUp(t, packaged[0], t.TempDir(), "serving through the device-plugin API"); exe != packageDPPath {
		t.Errorf("the installed plugin's serve runs %s, want %s\n%s", exe, packageDPPath, out)
	}

	// The installed DRA executable's compute-domain-controller becomes
	// gpu-device-plugin-controller beside it.
	ctlOut, err := runController(t, packageDRAPath)
	checkControllerHandedOver(t, ctlOut, err)

	// The hook where the plugin looks for it by default: static, stamped.
	checkStatic(t, packageHookPath, mustRead(t, packageHookPath))
	checkHookVersion(t, exec.Command(packageHookPath, "version"))

	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze is not installed: the unit was not verified")
	} else {
		out, err := exec.Command("systemd-analyze", "verify", "/usr/lib/systemd/system/gpu-device-plugin.service").CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}

	// The plugin leaves its CDI specs behind when it stops. An upgrade (the
	// same .deb again: postrm upgrade) keeps them; a purge (postrm remove,
	// then purge) removes them, and only them. In a mount namespace of its
	// own with a tmpfs on /run, so that this machine's /var/run/cdi is
	// neither read nor touched.
	specs, err := inPrivateRun(t, `
mkdir -p /var/run/cdi
touch /var/run/cdi/gpu-device-plugin_x.json /var/run/cdi/gpu-device-plugin_y.yaml /var/run/cdi/nvidia.yaml
dpkg -i "$1"
echo "after upgrade: $(cd /var/run/cdi && echo *)"
dpkg --purge gpu-device-plugin
echo "after purge: $(cd /var/run/cdi && echo *)"
`, deb)
	purged = err == nil
	if err != nil {
		t.Fatalf("upgrade and purge with CDI specs in /var/run/cdi: %v\n%s", err, specs)
	}
	for _, want := range []string{
		"after upgrade: gpu-device-plugin_x.json gpu-device-plugin_y.yaml nvidia.yaml\n",
		"after purge: nvidia.yaml\n",
	} {
		if !strings.Contains(specs, want) {
			t.Errorf("want %q in /var/run/cdi: the plugin's specs kept on upgrade, removed on purge, others kept\n%s", want, specs)
		}
	}
	for _, p := range append(packaged, "/etc/gpu-device-plugin", filepath.Dir(packageHookPath)) {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s is still there after dpkg --purge", p)
		}
	}
}

// inPrivateRun runs a shell script as root in a mount namespace of its own
// with an empty tmpfs on /run (and so /var/run): what it does there is
// gone when it ends, and the machine's /run is untouched.
func inPrivateRun(t *testing.T, script string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-ec", `mount -t tmpfs gpu-device-plugin-test "$(readlink -f /var/run)"` + "\n" + script, "sh"}, args...)...)
	// CLONE_NEWNS: Go makes every mount private in it, as unshare(1) does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func sorted(xs []string) []string {
	ys := slices.Clone(xs)
	slices.Sort(ys)
	return ys
}
