// Command imagebuild assembles the gpu-device-plugin container image
// without a container engine: the same layout as the repository's
// Dockerfile, written as a docker-archive tarball that `docker load`,
// `podman load`, `ctr images import` and `kind load image-archive` read.
//
// With -base the binaries go on top of a base image read from a local
// docker-archive tarball, OCI layout tarball or OCI layout directory.
// Without it the image starts from scratch plus the glibc pieces the
// binaries and NVML load, copied from the build machine: from / for its
// own architecture, from a cross libc's sysroot (-sysroot) for another.
//
//	imagebuild -binary bin/gpu-device-plugin -hook bin/gpu-device-plugin-cdi-hook -dp bin/gpu-device-plugin-dp -dra bin/gpu-device-plugin-dra -controller bin/gpu-device-plugin-controller -version v0.1.0 -commit abc1234 -o bin/gpu-device-plugin-image.tar
//	imagebuild -sysroot /usr/aarch64-linux-gnu -binary arm64/gpu-device-plugin ...   (arm64 binaries on an amd64 machine)
//
// The push subcommand uploads that tarball to a registry (make push),
// with the credentials docker login stored:
//
//	imagebuild push -tarball bin/gpu-device-plugin-image.tar -image registry.example.com/gpu-device-plugin:v0.1.0
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "push" {
		push(os.Args[2:])
		return
	}
	var o Options
	var created, extraLibs string
	flag.StringVar(&o.Binary, "binary", "bin/gpu-device-plugin", "the plugin binary to install as /usr/bin/gpu-device-plugin")
	flag.StringVar(&o.Hook, "hook", "bin/gpu-device-plugin-cdi-hook", "the CDI hook, a static binary, to install as /usr/bin/gpu-device-plugin-cdi-hook")
	flag.StringVar(&o.DP, "dp", "bin/gpu-device-plugin-dp", "the device-plugin mode's executable, which serve runs by default, to install as /usr/bin/gpu-device-plugin-dp")
	flag.StringVar(&o.DRA, "dra", "bin/gpu-device-plugin-dra", "the DRA executable, which serve runs in DRA mode, to install as /usr/bin/gpu-device-plugin-dra")
	flag.StringVar(&o.Controller, "controller", "bin/gpu-device-plugin-controller", "the ComputeDomain controller, which the chart's Deployment runs, to install as /usr/bin/gpu-device-plugin-controller")
	flag.StringVar(&o.PCIIDs, "pci-ids", "", `pci.ids to install as /usr/share/misc/pci.ids; empty searches the build machine, "none" leaves it out`)
	flag.StringVar(&o.Base, "base", "", "base image: a docker-archive or OCI layout tarball, or an OCI layout directory; empty builds from scratch with the host's glibc")
	flag.StringVar(&o.Sysroot, "sysroot", "/", "where a scratch image's glibc is taken from: / for binaries of the build machine's architecture, a cross libc's sysroot for another (/usr/aarch64-linux-gnu, from apt-get install libc6-dev-arm64-cross)")
	flag.StringVar(&extraLibs, "extra-libs", strings.Join(DefaultExtraLibs, ","), "libraries added to a scratch image besides the binary's own, by soname (those libnvidia-ml.so.1 needs)")
	flag.StringVar(&o.Version, "version", "dev", "org.opencontainers.image.version and the tag: the semantic version, as make version prints it")
	flag.StringVar(&o.Commit, "commit", "unknown", "org.opencontainers.image.revision")
	flag.StringVar(&o.Source, "source", "https://github.com/gpu-device-plugin/gpu-device-plugin", "org.opencontainers.image.source")
	flag.StringVar(&o.License, "license", "Apache-2.0", "org.opencontainers.image.licenses (SPDX)")
	flag.StringVar(&o.Repository, "repository", "ghcr.io/gpu-device-plugin/gpu-device-plugin", "repository named in the tarball's tag (the tag is the version)")
	flag.StringVar(&created, "created", "", "creation time, RFC 3339 or Unix seconds; empty uses $SOURCE_DATE_EPOCH, else the Unix epoch, so the same inputs give the same digest")
	flag.StringVar(&o.Output, "o", "bin/gpu-device-plugin-image.tar", "output tarball")
	flag.Parse()

	if extraLibs != "" {
		o.ExtraLibs = strings.Split(extraLibs, ",")
	}
	t, err := creationTime(created, os.Getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		fail(err)
	}
	o.Created = t
	o.Warn = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "imagebuild: warning: "+format+"\n", args...) }

	res, err := Build(o)
	if err != nil {
		fail(err)
	}
	fmt.Printf("imagebuild: %s: %s %s, %d layers, %.1f MiB compressed\n", o.Output, res.Tag, res.Digest, res.Layers, float64(res.CompressedSize)/(1<<20))
}

func push(args []string) {
	fs := flag.NewFlagSet("imagebuild push", flag.ExitOnError)
	tarPath := fs.String("tarball", "bin/gpu-device-plugin-image.tar", "the docker-archive tarball to push (make image writes it)")
	ref := fs.String("image", "", "where to push: registry/name:tag")
	fs.Parse(args)
	if fs.NArg() > 0 {
		fail(fmt.Errorf("push: unexpected arguments %q (the destination is -image)", fs.Args()))
	}
	digest, err := Push(context.Background(), *tarPath, *ref)
	if err != nil {
		fail(err)
	}
	fmt.Printf("imagebuild: pushed %s@%s\n", *ref, digest)
}

// creationTime reads -created, else SOURCE_DATE_EPOCH, else the epoch.
func creationTime(flagValue, sourceDateEpoch string) (time.Time, error) {
	for _, v := range []string{flagValue, sourceDateEpoch} {
		if v == "" {
			continue
		}
		if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
			return time.Unix(secs, 0).UTC(), nil
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return time.Time{}, fmt.Errorf("creation time %q: want RFC 3339 (2026-01-02T15:04:05Z) or Unix seconds", v)
		}
		return t.UTC(), nil
	}
	return time.Unix(0, 0).UTC(), nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "imagebuild:", err)
	os.Exit(1)
}
