package deploy

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

const (
	testVersion = "v9.8.7-e2e"
	testCommit  = "e2e1234"
	testEpoch   = "1700000000" // 2023-11-14T22:13:20Z
)

// dockerArchive is a docker-archive tarball read with nothing but the
// standard library, so the test does not trust the library that wrote it.
type dockerArchive struct {
	Manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	Config struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
		Created      string `json:"created"`
		Config       struct {
			Entrypoint []string
			Cmd        []string
			User       string
			Env        []string
			Labels     map[string]string
		} `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	ConfigDigest string
	Layers       [][]layerFile // in order, uncompressed
	Size         int64
}

type layerFile struct {
	Name string
	Mode int64
	Type byte
	Data []byte
}

func readDockerArchive(t *testing.T, path string) *dockerArchive {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	blobs := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		blobs[h.Name] = b
	}
	a := &dockerArchive{Size: fi.Size()}
	if err := json.Unmarshal(blobs["manifest.json"], &a.Manifest); err != nil || len(a.Manifest) != 1 {
		t.Fatalf("manifest.json: %v (%d images)", err, len(a.Manifest))
	}
	m := a.Manifest[0]
	cfg := blobs[m.Config]
	sum := sha256.Sum256(cfg)
	a.ConfigDigest = "sha256:" + hex.EncodeToString(sum[:])
	if !strings.HasSuffix(a.ConfigDigest, strings.TrimPrefix(m.Config, "sha256:")) {
		t.Errorf("config blob %s has digest %s", m.Config, a.ConfigDigest)
	}
	if err := json.Unmarshal(cfg, &a.Config); err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != len(a.Config.RootFS.DiffIDs) {
		t.Fatalf("%d layers, %d diff_ids", len(m.Layers), len(a.Config.RootFS.DiffIDs))
	}
	for i, name := range m.Layers {
		raw := blobs[name]
		if zr, err := gzip.NewReader(bytes.NewReader(raw)); err == nil {
			if raw, err = io.ReadAll(zr); err != nil {
				t.Fatalf("layer %s: %v", name, err)
			}
		}
		sum := sha256.Sum256(raw)
		if got := "sha256:" + hex.EncodeToString(sum[:]); got != a.Config.RootFS.DiffIDs[i] {
			t.Errorf("layer %d: uncompressed digest %s, config says %s", i, got, a.Config.RootFS.DiffIDs[i])
		}
		var files []layerFile
		lr := tar.NewReader(bytes.NewReader(raw))
		for {
			h, err := lr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("layer %d: %v", i, err)
			}
			b, _ := io.ReadAll(lr)
			files = append(files, layerFile{Name: strings.TrimSuffix(h.Name, "/"), Mode: h.Mode, Type: h.Typeflag, Data: b})
		}
		a.Layers = append(a.Layers, files)
	}
	return a
}

// files is the image's file system: the layers applied in order.
func (a *dockerArchive) files() map[string]layerFile {
	out := map[string]layerFile{}
	for _, l := range a.Layers {
		for _, f := range l {
			out[f.Name] = f
		}
	}
	return out
}

func buildImage(t *testing.T, bin string, pciIDs string) *dockerArchive {
	t.Helper()
	runMake(t, "image", "BIN="+bin, "VERSION="+testVersion, "COMMIT="+testCommit, "SOURCE_DATE_EPOCH="+testEpoch, "PCI_IDS="+pciIDs)
	return readDockerArchive(t, filepath.Join(bin, "gpu-device-plugin-image.tar"))
}

// TestImage builds the image as `make image` does, from scratch plus the
// build machine's glibc, and checks its config and files.
func TestImage(t *testing.T) {
	bin := filepath.Join(shared, "image")
	pciIDs := filepath.Join(shared, "pci.ids")
	if err := os.WriteFile(pciIDs, []byte("# a tiny pci.ids\n10de  NVIDIA Corporation\n\t2330  GH100 [H100 SXM5 80GB]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := buildImage(t, bin, pciIDs)
	t.Logf("image: %s, %d layers, %.1f MiB tarball", a.ConfigDigest, len(a.Layers), float64(a.Size)/(1<<20))

	c := a.Config
	if got := a.Manifest[0].RepoTags; !slices.Equal(got, []string{unpublishedImage + ":" + testVersion}) {
		t.Errorf("repo tags %q", got)
	}
	if c.OS != "linux" || c.Architecture == "" {
		t.Errorf("platform %s/%s", c.OS, c.Architecture)
	}
	if c.Created != "2023-11-14T22:13:20Z" {
		t.Errorf("created %q, want SOURCE_DATE_EPOCH's time", c.Created)
	}
	if !slices.Equal(c.Config.Entrypoint, []string{"/usr/bin/gpu-device-plugin"}) || !slices.Equal(c.Config.Cmd, []string{"serve"}) {
		t.Errorf("entrypoint %q cmd %q", c.Config.Entrypoint, c.Config.Cmd)
	}
	if c.Config.User != "0:0" {
		t.Errorf("user %q, want 0:0", c.Config.User)
	}
	for k, v := range map[string]string{
		"org.opencontainers.image.title":    "gpu-device-plugin",
		"org.opencontainers.image.version":  testVersion,
		"org.opencontainers.image.revision": testCommit,
		"org.opencontainers.image.source":   "https://github.com/gpu-device-plugin/gpu-device-plugin",
		"org.opencontainers.image.licenses": "Apache-2.0",
	} {
		if c.Config.Labels[k] != v {
			t.Errorf("label %s=%q, want %q", k, c.Config.Labels[k], v)
		}
	}

	files := a.files()
	binary, err := os.ReadFile(filepath.Join(bin, "gpu-device-plugin"))
	if err != nil {
		t.Fatal(err)
	}
	if f := files["usr/bin/gpu-device-plugin"]; !bytes.Equal(f.Data, binary) || f.Mode&0o111 == 0 {
		t.Errorf("usr/bin/gpu-device-plugin is not the built binary, executable (mode %o)", f.Mode)
	}
	// The daemons, beside the plugin, where serve looks first (for
	// gpu-device-plugin-dp, only), and the controller, beside
	// gpu-device-plugin-dra, where its compute-domain-controller looks.
	for name, p := range map[string]string{draName: imageDRAPath, dpName: imageDPPath, controllerName: imageControllerPath} {
		if f := files[strings.TrimPrefix(p, "/")]; !bytes.Equal(f.Data, mustRead(t, filepath.Join(bin, name))) || f.Mode&0o111 == 0 {
			t.Errorf("%s is not the built %s, executable (mode %o)", p, name, f.Mode)
		}
		if filepath.Dir(p) != filepath.Dir(c.Config.Entrypoint[0]) {
			t.Errorf("%s is not beside the entrypoint %s", p, c.Config.Entrypoint[0])
		}
	}
	// The CDI hook, which the chart's init container copies onto the host:
	// make's static build, executable.
	hookBinary := mustRead(t, filepath.Join(bin, hookName))
	if f := files[strings.TrimPrefix(imageHookPath, "/")]; !bytes.Equal(f.Data, hookBinary) || f.Mode&0o111 == 0 {
		t.Errorf("%s is not the built hook, executable (mode %o)", imageHookPath, f.Mode)
	} else {
		checkStatic(t, imageHookPath+" in the image", f.Data)
	}
	if f, want := files["usr/share/misc/pci.ids"], mustRead(t, pciIDs); !bytes.Equal(f.Data, want) {
		t.Errorf("usr/share/misc/pci.ids is not PCI_IDS' file")
	}
	// From scratch the image carries the dynamic loader the binary names,
	// libc, and what libnvidia-ml.so.1 links against.
	interp := interpreter(t, binary)
	want := []string{strings.TrimPrefix(interp, "/"), "etc/passwd", "tmp"}
	for _, lib := range []string{"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1"} {
		want = append(want, filepath.Join("lib", triplet(t), lib))
	}
	for _, p := range want {
		if _, ok := files[p]; !ok {
			t.Errorf("image has no %s", p)
		}
	}
	var names []string
	for n, f := range files {
		if f.Type == tar.TypeReg {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	t.Logf("files: %s", strings.Join(names, " "))

	t.Run("reproducible", func(t *testing.T) {
		again := buildImage(t, filepath.Join(shared, "image-again"), pciIDs)
		if again.ConfigDigest != a.ConfigDigest {
			t.Errorf("the same commit built twice: %s, then %s", a.ConfigDigest, again.ConfigDigest)
		}
	})
	t.Run("runs from its own root", func(t *testing.T) { testImageRuns(t, a) })
	t.Run("matches the Dockerfile", func(t *testing.T) { testDockerfile(t, a) })
}

// testImageRuns unpacks the image and runs the plugin in it with chroot:
// version shows the stamped build, and list loads a libnvidia-ml.so.1
// that links libm, libpthread, libdl and librt, as the driver's does,
// from /driver-root.
func testImageRuns(t *testing.T, a *dockerArchive) {
	if !isRoot() {
		t.Skip("chroot needs root")
	}
	root := t.TempDir()
	for _, f := range a.files() {
		p := filepath.Join(root, f.Name)
		switch f.Type {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, f.Data, os.FileMode(f.Mode)&0o7777); err != nil {
				t.Fatal(err)
			}
		}
	}
	run := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(a.Config.Config.Entrypoint[0], args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		cmd.Dir = "/"
		cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(nil, "version")
	if err != nil {
		t.Fatalf("version in the image: %v\n%s", err, out)
	}
	if !strings.Contains(out, "gpu-device-plugin "+testVersion+"\n") || !strings.Contains(out, "commit:  "+testCommit+"\n") {
		t.Errorf("version in the image is not stamped with %s %s:\n%s", testVersion, testCommit, out)
	}

	// What the chart's init container runs: the hook from the image copies
	// itself into a host directory, where it runs without the image's libc.
	// It reads /proc/self/exe, which every container has: a proc mount in a
	// mount namespace of the command's own, gone when it ends.
	imageCmd := func(path string, args ...string) *exec.Cmd {
		cmd := exec.Command("sh", append([]string{"-ec", `root=$1; shift; mount -t proc proc "$root/proc"; exec chroot "$root" "$@"`,
			"sh", root, path}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
		return cmd
	}
	hookCmd := func(args ...string) *exec.Cmd { return imageCmd(imageHookPath, args...) }
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o555); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"mount", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the hook was not run in the image", tool)
		}
	}
	checkHookVersion(t, hookCmd("version"))
	if out, err := hookCmd("install", "--dir=/host/bin").CombinedOutput(); err != nil {
		t.Fatalf("%s install in the image: %v\n%s", hookName, err, out)
	}
	installed := filepath.Join(root, "host", "bin", hookName)
	if fi, err := os.Stat(installed); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("%s install --dir=/host/bin: %v (mode %v), want an executable %s", hookName, err, fi, installed)
	}
	checkHookVersion(t, exec.Command(installed, "version"))

	lib := buildMockLikeDriver(t, filepath.Join(root, "driver-root", "usr", "lib", triplet(t)))
	profile := repoPath(t, "e2e", "profiles", "pcie-4gpu.profile")
	if err := os.WriteFile(filepath.Join(root, "mock.profile"), mustRead(t, profile), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = run([]string{"MOCK_NVML_PROFILE=/mock.profile"}, "list", "--driver-root=/driver-root")
	if err != nil {
		t.Fatalf("list in the image, NVML from /driver-root (%s): %v\n%s", lib, err, out)
	}
	if !strings.Contains(out, "NVIDIA L40S") {
		t.Errorf("list in the image found no GPUs:\n%s", out)
	}

	// DRA mode, as the chart runs it: serve becomes the image's
	// gpu-device-plugin-dra, which starts on the image's libraries.
	draDir := "/tmp/dra"
	if err := os.MkdirAll(filepath.Join(root, draDir), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := imageCmd(a.Config.Config.Entrypoint[0], handOverArgs(draDir)...).CombinedOutput()
	checkHandedOver(t, string(b), err, draDir)
}

// buildMockLikeDriver builds the mock NVML library into dir, linked like
// the driver's libnvidia-ml.so.1 (DT_NEEDED libm, libpthread, libdl, librt).
func buildMockLikeDriver(t *testing.T, dir string) string {
	t.Helper()
	built, err := mocknvml.Build(filepath.Join(shared, "mock"))
	if err != nil {
		t.Fatal(err)
	}
	inc, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, mocknvml.LibraryName)
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	cmd := exec.Command(cc, "-shared", "-fPIC", "-O2", "-pthread", "-DNVML_NO_UNVERSIONED_FUNC_DEFS",
		"-I", filepath.Join(strings.TrimSpace(string(inc)), "pkg", "nvml"),
		"-Wl,-soname,"+mocknvml.LibraryName, "-Wl,-z,nodelete", "-o", lib,
		repoPath(t, "e2e", "mocknvml", "mocknvml.c"),
		"-Wl,--no-as-needed", "-lm", "-lpthread", "-ldl", "-lrt")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Logf("building the mock with the driver's links: %v\n%s; using the plain mock", err, out)
		if err := os.WriteFile(lib, mustRead(t, built), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return lib
}

// testDockerfile checks the Dockerfile promises the layout make image
// builds: the same entrypoint, command, user, labels and files, and the
// Makefile's build flags.
func testDockerfile(t *testing.T, a *dockerArchive) {
	b := mustRead(t, repoPath(t, "Dockerfile"))
	var lines []string // instructions, continuation lines joined
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || (l == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(l)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	instr := func(name string) []string {
		var out []string
		for _, l := range lines {
			if kw, rest, _ := strings.Cut(l, " "); strings.EqualFold(kw, name) {
				out = append(out, strings.TrimSpace(rest))
			}
		}
		return out
	}
	last := func(name string) string {
		xs := instr(name)
		if len(xs) == 0 {
			t.Fatalf("Dockerfile has no %s", name)
		}
		return xs[len(xs)-1]
	}
	var ep, cmd []string
	if err := json.Unmarshal([]byte(last("ENTRYPOINT")), &ep); err != nil || !slices.Equal(ep, a.Config.Config.Entrypoint) {
		t.Errorf("Dockerfile ENTRYPOINT %s (%v), image has %q", last("ENTRYPOINT"), err, a.Config.Config.Entrypoint)
	}
	if err := json.Unmarshal([]byte(last("CMD")), &cmd); err != nil || !slices.Equal(cmd, a.Config.Config.Cmd) {
		t.Errorf("Dockerfile CMD %s (%v), image has %q", last("CMD"), err, a.Config.Config.Cmd)
	}
	if u := last("USER"); u != a.Config.Config.User {
		t.Errorf("Dockerfile USER %s, image has %s", u, a.Config.Config.User)
	}
	labels := strings.Join(instr("LABEL"), " ")
	for k := range a.Config.Config.Labels {
		if k != "org.opencontainers.image.created" && !strings.Contains(labels, k+"=") {
			t.Errorf("Dockerfile sets no label %s", k)
		}
	}
	copies := strings.Join(instr("COPY"), "\n")
	for _, p := range []string{"/usr/bin/gpu-device-plugin", imageDPPath, imageDRAPath, imageControllerPath, imageHookPath, "/usr/share/misc/pci.ids"} {
		if !regexp.MustCompile(`\s` + regexp.QuoteMeta(p) + `(\s|$)`).MatchString(copies) {
			t.Errorf("Dockerfile copies nothing to %s", p)
		}
	}
	var pluginBuild, dpBuild, draBuild, controllerBuild, hookBuild string
	for _, r := range instr("RUN") {
		switch {
		case strings.Contains(r, "./cmd/gpu-device-plugin-cdi-hook"):
			hookBuild = r
		case strings.Contains(r, "./cmd/"+dpName):
			dpBuild = r
		case strings.Contains(r, "./cmd/"+draName):
			draBuild = r
		case strings.Contains(r, "./cmd/"+controllerName):
			controllerBuild = r
		case strings.Contains(r, "./cmd/gpu-device-plugin"):
			pluginBuild = r
		}
	}
	for _, want := range []string{"-trimpath", "-X main.version=${VERSION}", "-X main.commit=${COMMIT}", "./cmd/gpu-device-plugin"} {
		if !strings.Contains(pluginBuild, want) {
			t.Errorf("Dockerfile's go build of the plugin lacks %s", want)
		}
	}
	// The daemons and the controller as make builds them: like the plugin
	// (cgo, for NVML).
	for name, build := range map[string]string{dpName: dpBuild, draName: draBuild, controllerName: controllerBuild} {
		for _, want := range []string{"-trimpath", "-X main.version=${VERSION}", "-X main.commit=${COMMIT}", "-o /out/" + name} {
			if !strings.Contains(build, want) {
				t.Errorf("Dockerfile's go build of %s lacks %s", name, want)
			}
		}
		if strings.Contains(build, "CGO_ENABLED=0") {
			t.Errorf("Dockerfile builds %s without cgo; make builds it with", name)
		}
	}
	// The Makefile's GOTAGS, which leave out what only costs resident
	// memory (docs/architecture.md, "Where the memory goes").
	tags := makefileVar(t, "GOTAGS")
	for name, build := range map[string]string{"the plugin": pluginBuild, dpName: dpBuild, draName: draBuild, controllerName: controllerBuild} {
		if !strings.Contains(build, "-tags "+tags+" ") {
			t.Errorf("Dockerfile's go build of %s lacks -tags %s, the Makefile's GOTAGS", name, tags)
		}
	}
	// Static, as make builds it: the runtime runs the hook on the host.
	for _, want := range []string{"CGO_ENABLED=0 go build", "-trimpath", "-X main.version=${VERSION}", "-X main.commit=${COMMIT}", "-o /out/" + hookName} {
		if !strings.Contains(hookBuild, want) {
			t.Errorf("Dockerfile's go build of the CDI hook lacks %s", want)
		}
	}
}

// makefileVar is the value of a "NAME = value" line of the Makefile.
func makefileVar(t *testing.T, name string) string {
	t.Helper()
	for _, l := range strings.Split(string(mustRead(t, repoPath(t, "Makefile"))), "\n") {
		if v, ok := strings.CutPrefix(l, name+" = "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("the Makefile sets no %s", name)
	return ""
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// interpreter is the dynamic loader an ELF binary names (PT_INTERP).
func interpreter(t *testing.T, binary []byte) string {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(binary))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			buf := make([]byte, p.Filesz)
			if _, err := p.ReadAt(buf, 0); err != nil {
				t.Fatal(err)
			}
			return string(bytes.TrimRight(buf, "\x00"))
		}
	}
	t.Fatal("the plugin binary has no PT_INTERP: it is static, and the image needs no glibc")
	return ""
}

func triplet(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOARCH").Output()
	if err != nil {
		t.Fatal(err)
	}
	switch a := strings.TrimSpace(string(out)); a {
	case "amd64":
		return "x86_64-linux-gnu"
	case "arm64":
		return "aarch64-linux-gnu"
	default:
		t.Skipf("no multiarch triplet known for %s", a)
		return ""
	}
}
