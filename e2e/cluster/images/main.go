// Command images builds the images a test node needs and cannot pull: the
// pod sandbox (pause) and the test container (probe), each one static Go
// binary in an otherwise empty image, and (-bin, for kind's node image) an
// image of each static binary given, such as kube-apiserver. All are written
// as docker-archive tarballs that `ctr images import` and `kind load
// image-archive` read.
//
//	go run ./cluster/images -o DIR [-pause localhost/e2e/pause:v1] [-probe localhost/e2e/probe:v1] [-bin REF=PATH]...
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

func main() {
	out := flag.String("o", "", "output directory (pause.tar, probe.tar)")
	pause := flag.String("pause", "localhost/e2e/pause:v1", "the sandbox image's name")
	probe := flag.String("probe", "localhost/e2e/probe:v1", "the test image's name; empty: no probe image")
	var bins binFlags
	flag.Var(&bins, "bin", "REF=PATH: an image REF holding the binary PATH at /usr/local/bin, as BASENAME.tar (repeatable);\n"+
		"a dynamically linked one gets this machine's loader and the libraries it needs, and NVML's")
	flag.Parse()
	if *out == "" {
		fail(fmt.Errorf("-o is required"))
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fail(err)
	}
	src, err := sourceDir()
	if err != nil {
		fail(err)
	}
	imgs := []struct{ name, ref string }{{"pause", *pause}}
	if *probe != "" {
		imgs = append(imgs, struct{ name, ref string }{"probe", *probe})
	}
	for _, img := range imgs {
		bin := filepath.Join(*out, img.name)
		if err := build(filepath.Join(src, img.name), bin); err != nil {
			fail(err)
		}
		tarball := filepath.Join(*out, img.name+".tar")
		var extra []file
		if img.name == "probe" {
			// The build machine's static ldconfig, so the probe can list
			// the ld cache the CDI hook updates, as Triton reads it.
			if _, err := os.Stat(hostLdconfig); err == nil {
				extra = append(extra, file{path: "/sbin/ldconfig", from: hostLdconfig})
			} else {
				fmt.Fprintf(os.Stderr, "images: warning: no %s; the probe image has no ldconfig\n", hostLdconfig)
			}
		}
		if err := writeImage(tarball, img.ref, bin, "/"+img.name, extra...); err != nil {
			fail(err)
		}
		os.Remove(bin)
		fmt.Printf("images: %s: %s\n", tarball, img.ref)
	}
	for _, b := range bins {
		name := filepath.Base(b.path)
		tarball := filepath.Join(*out, name+".tar")
		extra, err := runtimeFiles(b.path)
		if err != nil {
			fail(err)
		}
		if err := writeImage(tarball, b.ref, b.path, "/usr/local/bin/"+name, extra...); err != nil {
			fail(err)
		}
		fmt.Printf("images: %s: %s\n", tarball, b.ref)
	}
}

// nvmlLibs are the libraries libnvidia-ml.so.1 links against besides libc
// (tools/imagebuild's DefaultExtraLibs): a binary that dlopens NVML needs
// them in its image even though it does not link them itself.
var nvmlLibs = []string{"libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1"}

// runtimeFiles returns, for a dynamically linked binary, its interpreter at
// the path it names and every library it needs (transitively, and
// nvmlLibs), from this machine, under /lib/<triplet>; nothing for a static
// one. NVIDIA's device plugin and GFD use cgo to dlopen NVML.
func runtimeFiles(bin string) ([]file, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var interp string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return nil, err
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if interp == "" {
		return nil, nil
	}
	triplet := map[elf.Machine]string{elf.EM_X86_64: "x86_64-linux-gnu", elf.EM_AARCH64: "aarch64-linux-gnu"}[f.Machine]
	if triplet == "" {
		return nil, fmt.Errorf("%s: unsupported machine %s", bin, f.Machine)
	}
	dirs := []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib64", "/usr/lib64"}
	find := func(soname string) string {
		for _, d := range dirs {
			if p := filepath.Join(d, soname); fileExists(p) {
				return p
			}
		}
		return ""
	}
	files := []file{{path: interp, from: interp}}
	seen := map[string]bool{}
	var add func(path string, optional bool, soname string) error
	add = func(path string, optional bool, soname string) error {
		if seen[soname] {
			return nil
		}
		seen[soname] = true
		host := find(soname)
		if host == "" {
			if optional {
				return nil
			}
			return fmt.Errorf("%s needs %s, which is not on this machine", path, soname)
		}
		files = append(files, file{path: "/lib/" + triplet + "/" + soname, from: host})
		lf, err := elf.Open(host)
		if err != nil {
			return err
		}
		defer lf.Close()
		needed, _ := lf.ImportedLibraries()
		for _, n := range needed {
			if err := add(host, false, n); err != nil {
				return err
			}
		}
		return nil
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return nil, err
	}
	for _, n := range needed {
		if err := add(bin, false, n); err != nil {
			return nil, err
		}
	}
	for _, n := range nvmlLibs {
		if err := add(bin, true, n); err != nil {
			return nil, err
		}
	}
	return files, nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// binFlags are the -bin REF=PATH flags.
type binFlags []struct{ ref, path string }

func (b *binFlags) String() string { return fmt.Sprint(*b) }

func (b *binFlags) Set(v string) error {
	ref, path, ok := strings.Cut(v, "=")
	if !ok || ref == "" || path == "" {
		return fmt.Errorf("%q: want REF=PATH, as registry.k8s.io/kube-apiserver:v1.37.0=/path/to/kube-apiserver", v)
	}
	*b = append(*b, struct{ ref, path string }{ref, path})
	return nil
}

// sourceDir is this command's directory, which holds pause/ and probe/.
func sourceDir() (string, error) {
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "github.com/gpu-device-plugin/gpu-device-plugin/e2e/cluster/images").Output()
	if err != nil {
		return "", fmt.Errorf("finding the images source: %w", err)
	}
	return string(bytes.TrimSpace(out)), nil
}

// build compiles a static binary: no cgo, so the image needs no libc.
func build(pkg, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = pkg
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// hostLdconfig is glibc's ldconfig, statically linked on Debian.
const hostLdconfig = "/sbin/ldconfig"

// file is a host file copied into an image at path.
type file struct{ path, from string }

// writeImage writes a one-layer docker-archive: the binary at path, as the
// entrypoint, the extra files, and the empty directories runc mounts over
// (and /etc/ld.so.conf.d, as distributions have it). File times are the
// epoch, so the same inputs give the same image ID.
func writeImage(tarball, ref, bin, path string, extra ...file) error {
	exe, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	epoch := time.Unix(0, 0)
	dirs := []string{"dev", "etc", "etc/ld.so.conf.d", "proc", "sbin", "sys", "tmp"}
	for _, p := range append([]string{path}, filePaths(extra)...) {
		for d := filepath.Dir(p[1:]); d != "." && !slices.Contains(dirs, d); d = filepath.Dir(d) {
			dirs = append(dirs, d)
		}
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := lw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: epoch}); err != nil {
			return err
		}
	}
	if err := lw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path[1:], Mode: 0o755, Size: int64(len(exe)), ModTime: epoch}); err != nil {
		return err
	}
	if _, err := lw.Write(exe); err != nil {
		return err
	}
	for _, f := range extra {
		b, err := os.ReadFile(f.from)
		if err != nil {
			return err
		}
		if err := lw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.path[1:], Mode: 0o755, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		if _, err := lw.Write(b); err != nil {
			return err
		}
	}
	if err := lw.Close(); err != nil {
		return err
	}
	layerDigest := digest(layer.Bytes())

	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Entrypoint": []string{path},
			"Env":        []string{"PATH=" + filepath.Dir(path)},
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerDigest}},
		"history": []map[string]string{{"created": epoch.UTC().Format(time.RFC3339), "created_by": "e2e/cluster/images"}},
	})
	if err != nil {
		return err
	}
	configName := digest(config) + ".json"
	layerName := layerDigest + "/layer.tar"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": []string{ref},
		"Layers":   []string{layerName},
	}})
	if err != nil {
		return err
	}

	f, err := os.Create(tarball)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		data []byte
	}{{configName, config}, {layerName, layer.Bytes()}, {"manifest.json", manifest}} {
		if dir := filepath.Dir(e.name); dir != "." {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func filePaths(files []file) []string {
	var p []string
	for _, f := range files {
		p = append(p, f.path)
	}
	return p
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "images:", err)
	os.Exit(1)
}
