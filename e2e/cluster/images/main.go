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
	flag.Var(&bins, "bin", "REF=PATH: an image REF holding the static binary PATH at /usr/local/bin, as BASENAME.tar (repeatable)")
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
		if err := writeImage(tarball, b.ref, b.path, "/usr/local/bin/"+name); err != nil {
			fail(err)
		}
		fmt.Printf("images: %s: %s\n", tarball, b.ref)
	}
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
	for d := filepath.Dir(path[1:]); d != "." && !slices.Contains(dirs, d); d = filepath.Dir(d) {
		dirs = append(dirs, d)
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

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "images:", err)
	os.Exit(1)
}
