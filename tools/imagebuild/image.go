package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/gpu-device-plugin/gpu-device-plugin/tools/elfcheck"
	"github.com/gpu-device-plugin/gpu-device-plugin/tools/unpack"
	"github.com/gpu-device-plugin/gpu-device-plugin/tools/version"
)

// The image's layout, shared with the Dockerfile (a test keeps them equal).
const (
	BinaryPath = "/usr/bin/gpu-device-plugin"
	// HookPath is the CDI hook, static, which the chart's init container
	// copies onto the host (gpu-device-plugin-cdi-hook install --dir).
	HookPath = "/usr/bin/gpu-device-plugin-cdi-hook"
	// DPPath is gpu-device-plugin-dp, the device-plugin mode's
	// executable, which `gpu-device-plugin serve` runs by default; serve
	// looks for it beside its own executable only, so this must stay in
	// BinaryPath's directory.
	DPPath = "/usr/bin/gpu-device-plugin-dp"
	// DRAPath is gpu-device-plugin-dra, which `gpu-device-plugin serve`
	// execs in DRA mode; it looks beside its own executable first, so this
	// must stay in BinaryPath's directory.
	DRAPath = "/usr/bin/gpu-device-plugin-dra"
	// ControllerPath is gpu-device-plugin-controller, the ComputeDomain
	// controller the chart's Deployment runs; gpu-device-plugin-dra
	// compute-domain-controller (charts of earlier releases) execs it from
	// beside itself, so this must stay in DRAPath's directory.
	ControllerPath = "/usr/bin/gpu-device-plugin-controller"
	PCIIDsPath     = "/usr/share/misc/pci.ids"
	// User is root: the plugin creates its socket in the kubelet's
	// root-owned device-plugin directory and connects to kubelet.sock
	// (mode 0755 root), and NVML opens /dev/nvidia*.
	User = "0:0"
)

var (
	Entrypoint = []string{BinaryPath}
	Cmd        = []string{"serve"}
)

// pciIDsLocations are where distributions install pci.ids.
var pciIDsLocations = []string{"/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids"}

// Options say what goes into the image.
type Options struct {
	Binary     string
	Hook       string // the CDI hook, a static binary for the plugin's architecture
	DP         string // gpu-device-plugin-dp, the device-plugin mode's executable, built like Binary
	DRA        string // gpu-device-plugin-dra, built like Binary
	Controller string // gpu-device-plugin-controller, the ComputeDomain controller, built like Binary
	PCIIDs     string // "" searches the build machine, "none" skips
	Base       string
	ExtraLibs  []string
	// Sysroot is where a scratch image's glibc comes from: "" is /, the
	// build machine's, for binaries of its own architecture; a cross
	// libc's sysroot (/usr/aarch64-linux-gnu) for another.
	Sysroot    string
	Version    string
	Commit     string
	Source     string
	License    string
	Repository string
	Created    time.Time
	Output     string
	Warn       func(format string, args ...any)
	// WorkDir is where an OCI layout tarball given as Base is unpacked; it
	// must outlive the image, whose layers are read lazily. Build makes
	// and removes one; empty makes one under $TMPDIR that is left behind.
	WorkDir string
}

// Result describes the written tarball.
type Result struct {
	Tag            string
	Digest         v1.Hash
	Layers         int
	CompressedSize int64
}

// Build assembles the image and writes it as a docker-archive tarball.
func Build(o Options) (Result, error) {
	if o.Warn == nil {
		o.Warn = func(string, ...any) {}
	}
	if o.Sysroot == "" {
		o.Sysroot = "/"
	}
	if o.WorkDir == "" {
		dir, err := os.MkdirTemp("", "imagebuild-")
		if err != nil {
			return Result{}, err
		}
		defer os.RemoveAll(dir)
		o.WorkDir = dir
	}
	img, err := Image(o)
	if err != nil {
		return Result{}, err
	}
	tag, err := name.NewTag(o.Repository+":"+version.Tag(o.Version), name.WeakValidation)
	if err != nil {
		return Result{}, fmt.Errorf("image tag: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(o.Output), 0o755); err != nil {
		return Result{}, err
	}
	tmp := o.Output + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return Result{}, fmt.Errorf("writing %s: %w", o.Output, err)
	}
	if err := os.Rename(tmp, o.Output); err != nil {
		return Result{}, err
	}
	res := Result{Tag: tag.String()}
	if res.Digest, err = img.Digest(); err != nil {
		return res, err
	}
	layers, err := img.Layers()
	if err != nil {
		return res, err
	}
	res.Layers = len(layers)
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return res, err
		}
		res.CompressedSize += n
	}
	return res, nil
}

// Image builds the image in memory.
func Image(o Options) (v1.Image, error) {
	if o.Warn == nil {
		o.Warn = func(string, ...any) {}
	}
	if o.Sysroot == "" {
		o.Sysroot = "/"
	}
	binary, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("reading the plugin binary (run make build first): %w", err)
	}
	rt, err := ResolveRuntime(o.Binary, o.Sysroot, o.ExtraLibs, o.Warn)
	if err != nil {
		return nil, err
	}
	if o.Hook == "" {
		return nil, errors.New("no CDI hook given (-hook bin/gpu-device-plugin-cdi-hook; make build builds it)")
	}
	if err := elfcheck.Static(o.Hook, rt.Arch); err != nil {
		return nil, fmt.Errorf("the CDI hook: %w", err)
	}
	hook, err := os.ReadFile(o.Hook)
	if err != nil {
		return nil, fmt.Errorf("reading the CDI hook: %w", err)
	}
	// The executables serve runs, one per mode. Each may link more than
	// the plugin (the DRA one does: the Kubernetes client), so whatever
	// libraries they need go into a scratch image too.
	dp, err := modeExecutable(rt, o, "device-plugin mode's executable", "-dp bin/gpu-device-plugin-dp", o.DP)
	if err != nil {
		return nil, err
	}
	dra, err := modeExecutable(rt, o, "DRA executable", "-dra bin/gpu-device-plugin-dra", o.DRA)
	if err != nil {
		return nil, err
	}
	// Not one of them, but built as they are, with the Kubernetes client.
	controller, err := modeExecutable(rt, o, "ComputeDomain controller", "-controller bin/gpu-device-plugin-controller", o.Controller)
	if err != nil {
		return nil, err
	}

	var img v1.Image
	if o.Base != "" {
		if img, err = loadBase(o.Base, rt.Arch, o.WorkDir); err != nil {
			return nil, err
		}
	} else {
		// From scratch: the dynamic loader, glibc and the libraries NVML
		// needs, root's passwd entry and a /tmp.
		sys := newLayer(o.Created)
		if err := rt.addTo(sys, o.Sysroot); err != nil {
			return nil, fmt.Errorf("collecting glibc for the image: %w", err)
		}
		sys.file("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\n"))
		sys.file("/etc/group", 0o644, []byte("root:x:0:\n"))
		sys.dir("/tmp", 0o1777)
		l, err := sys.layer()
		if err != nil {
			return nil, err
		}
		from := "the build machine"
		if filepath.Clean(o.Sysroot) != "/" {
			from += "'s " + o.Sysroot
		}
		if img, err = mutate.Append(empty.Image, mutate.Addendum{Layer: l, History: v1.History{
			Created: v1.Time{Time: o.Created}, CreatedBy: "imagebuild: glibc from " + from, Comment: rt.Interpreter,
		}}); err != nil {
			return nil, err
		}
	}

	app := newLayer(o.Created)
	app.file(BinaryPath, 0o755, binary)
	app.file(HookPath, 0o755, hook)
	app.file(DPPath, 0o755, dp)
	app.file(DRAPath, 0o755, dra)
	app.file(ControllerPath, 0o755, controller)
	if ids := o.pciIDs(); ids != "" {
		b, err := os.ReadFile(ids)
		if err != nil {
			return nil, fmt.Errorf("reading pci.ids: %w", err)
		}
		app.file(PCIIDsPath, 0o644, b)
	}
	l, err := app.layer()
	if err != nil {
		return nil, err
	}
	if img, err = mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{
		Created: v1.Time{Time: o.Created}, CreatedBy: "imagebuild: gpu-device-plugin " + o.Version,
	}}); err != nil {
		return nil, err
	}

	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = rt.Arch
	cf.Config.Entrypoint = Entrypoint
	cf.Config.Cmd = Cmd
	cf.Config.User = User
	cf.Config.WorkingDir = "/"
	if !hasEnv(cf.Config.Env, "PATH") {
		cf.Config.Env = append(cf.Config.Env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	if cf.Config.Labels == nil {
		cf.Config.Labels = map[string]string{}
	}
	for k, v := range Labels(o) {
		cf.Config.Labels[k] = v
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	return mutate.CreatedAt(img, v1.Time{Time: o.Created})
}

// modeExecutable reads file, one of the executables serve runs or the
// controller (name says which; flag is imagebuild's flag for it with its default), and merges
// the libraries it needs into rt: it is required, must be for rt's
// architecture and, when dynamic, must name rt's loader.
func modeExecutable(rt *Runtime, o Options, name, flag, file string) ([]byte, error) {
	if file == "" {
		return nil, fmt.Errorf("no %s given (%s; make build builds it)", name, flag)
	}
	own, err := ResolveRuntime(file, o.Sysroot, nil, o.Warn)
	if err != nil {
		return nil, fmt.Errorf("the %s: %w", name, err)
	}
	if err := rt.merge(own); err != nil {
		return nil, fmt.Errorf("the %s %s: %w", name, file, err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the %s: %w", name, err)
	}
	return b, nil
}

// Labels are the OCI annotations the image carries (the Dockerfile sets
// the same keys).
func Labels(o Options) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "gpu-device-plugin",
		"org.opencontainers.image.description": "Kubernetes device plugin for NVIDIA GPUs",
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.revision":    o.Commit,
		"org.opencontainers.image.source":      o.Source,
		"org.opencontainers.image.licenses":    o.License,
		"org.opencontainers.image.created":     o.Created.Format(time.RFC3339),
	}
}

func (o Options) pciIDs() string {
	switch o.PCIIDs {
	case "none":
		return ""
	case "":
		// The same file for every architecture: the build machine's.
		for _, p := range pciIDsLocations {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
		o.Warn("no pci.ids on this machine (%s); the image will list NICs without vendor and device names. "+
			"Install Debian's pci.ids package or give -pci-ids", strings.Join(pciIDsLocations, ", "))
		return ""
	default:
		return o.PCIIDs
	}
}

func hasEnv(env []string, key string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, key+"=") {
			return true
		}
	}
	return false
}

// loadBase reads a base image: an OCI layout directory, an OCI layout
// tarball, or a docker-archive tarball (docker save). From an index it
// takes the manifest for arch.
func loadBase(p, arch, workDir string) (v1.Image, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("base image: %w", err)
	}
	if fi.IsDir() {
		return fromLayout(p, arch)
	}
	if img, err := tarball.ImageFromPath(p, nil); err == nil {
		if _, err := img.ConfigFile(); err == nil {
			return img, nil
		}
	}
	// Not docker-archive: unpack it as an OCI layout.
	dir, err := os.MkdirTemp(workDir, "base-")
	if err != nil {
		return nil, err
	}
	if err := unpack.Tarball(p, dir); err != nil {
		return nil, fmt.Errorf("base image %s is neither a docker-archive nor an OCI layout tarball: %w", p, err)
	}
	return fromLayout(dir, arch)
}

func fromLayout(dir, arch string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("base image %s: %w", dir, err)
	}
	return pickImage(idx, arch, dir)
}

// pickImage walks an index (nested indexes included) to the image for arch.
func pickImage(idx v1.ImageIndex, arch, where string) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("base image %s: %w", where, err)
	}
	for _, d := range m.Manifests {
		if d.Platform != nil && (d.Platform.OS != "linux" || d.Platform.Architecture != arch) {
			continue
		}
		if d.MediaType.IsIndex() {
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			if img, err := pickImage(child, arch, where); err == nil {
				return img, nil
			}
			continue
		}
		if d.MediaType.IsImage() {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("base image %s: no linux/%s image in it", where, arch)
}
