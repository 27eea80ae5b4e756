// Command pkgbuild builds the gpu-device-plugin node OS packages (.deb and
// .rpm) with nfpm from packaging/nfpm.yaml: the binary and the
// executables its serve command runs (gpu-device-plugin-dp, the
// device-plugin mode's, which it runs by default, and
// gpu-device-plugin-dra, DRA mode's) and the ComputeDomain controller
// (gpu-device-plugin-controller) in /usr/bin, the CDI hook in
// /usr/libexec/gpu-device-plugin, the systemd unit, the config file and
// the environment file as conffiles.
//
//	pkgbuild -binary bin/gpu-device-plugin -hook bin/gpu-device-plugin-cdi-hook -dp bin/gpu-device-plugin-dp -dra bin/gpu-device-plugin-dra -controller bin/gpu-device-plugin-controller -version v0.1.0 -o bin
package main

import (
	"debug/elf"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb"
	_ "github.com/goreleaser/nfpm/v2/rpm"

	"github.com/gpu-device-plugin/gpu-device-plugin/tools/elfcheck"
	"github.com/gpu-device-plugin/gpu-device-plugin/tools/version"
)

func main() {
	var (
		config  = flag.String("config", "packaging/nfpm.yaml", "nfpm configuration; its relative paths are read from -root")
		root    = flag.String("root", ".", "repository root")
		binary  = flag.String("binary", "bin/gpu-device-plugin", "the plugin binary")
		hook    = flag.String("hook", "bin/gpu-device-plugin-cdi-hook", "the CDI hook, a static binary")
		dp      = flag.String("dp", "bin/gpu-device-plugin-dp", "the device-plugin mode's executable, which serve runs by default")
		dra     = flag.String("dra", "bin/gpu-device-plugin-dra", "the DRA executable, which serve runs in DRA mode")
		ctl     = flag.String("controller", "bin/gpu-device-plugin-controller", "the ComputeDomain controller, which gpu-device-plugin-dra compute-domain-controller runs")
		vers    = flag.String("version", "dev", "the semantic version, as make version prints it (or `git describe` output); made into a package version")
		license = flag.String("license", "", "SPDX license, overriding the configuration's")
		formats = flag.String("formats", "deb,rpm", "comma-separated package formats")
		out     = flag.String("o", "bin", "output directory")
	)
	flag.Parse()
	files, err := Build(Options{
		Config: *config, Root: *root, Binary: *binary, Hook: *hook, DP: *dp, DRA: *dra, Controller: *ctl, Version: *vers,
		License: *license, Formats: strings.Split(*formats, ","), OutDir: *out,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "pkgbuild:", err)
		os.Exit(1)
	}
	for _, f := range files {
		fmt.Println("pkgbuild:", f)
	}
}

// Options say what to package.
type Options struct {
	Config, Root, Binary, Hook, DP, DRA, Controller, Version, License, OutDir string
	Formats                                                                   []string
}

// Build writes one package per format into OutDir and returns their paths.
func Build(o Options) ([]string, error) {
	abs := func(p string) (string, error) {
		if filepath.IsAbs(p) {
			return p, nil
		}
		return filepath.Abs(p)
	}
	// The executables serve runs, one per mode, and the controller, built
	// as they are.
	modes := []struct {
		name, flag string
		file       *string
	}{
		{"device-plugin mode's executable", "-dp", &o.DP},
		{"DRA executable", "-dra", &o.DRA},
		{"ComputeDomain controller", "-controller", &o.Controller},
	}
	for _, m := range modes {
		if *m.file == "" {
			return nil, fmt.Errorf("no %s given (%s)", m.name, m.flag)
		}
	}
	var err error
	for _, p := range []*string{&o.Config, &o.Root, &o.Binary, &o.Hook, &o.DP, &o.DRA, &o.Controller, &o.OutDir} {
		if *p, err = abs(*p); err != nil {
			return nil, err
		}
	}
	arch, glibc, err := binaryFacts(o.Binary)
	if err != nil {
		return nil, err
	}
	// They may link more than the plugin (the DRA executable and the
	// controller do: the Kubernetes client), so the package's glibc
	// dependency is the newest of them all.
	versions := []string{"GLIBC_" + glibc}
	for _, m := range modes {
		modeArch, modeGLIBC, err := binaryFacts(*m.file)
		if err != nil {
			return nil, fmt.Errorf("the %s: %w", m.name, err)
		}
		if modeArch != arch {
			return nil, fmt.Errorf("the %s %s is for %s, the plugin for %s", m.name, *m.file, modeArch, arch)
		}
		versions = append(versions, "GLIBC_"+modeGLIBC)
	}
	glibc = NewestGLIBC(versions)
	if err := elfcheck.Static(o.Hook, arch); err != nil {
		return nil, fmt.Errorf("the CDI hook: %w", err)
	}
	vars := map[string]string{
		"VERSION":    version.Package(o.Version),
		"ARCH":       arch,
		"BINARY":     o.Binary,
		"HOOK":       o.Hook,
		"DP":         o.DP,
		"DRA":        o.DRA,
		"CONTROLLER": o.Controller,
		"GLIBC":      glibc,
	}
	mapping := func(k string) string {
		if v, ok := vars[k]; ok {
			return v
		}
		return os.Getenv(k)
	}
	// nfpm reads the contents' relative sources from the working directory,
	// when it validates them and when it packages them.
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	if err := os.Chdir(o.Root); err != nil {
		return nil, err
	}
	defer os.Chdir(wd)
	cfg, err := nfpm.ParseFileWithEnvMapping(o.Config, mapping)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.Config, err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", o.Config, err)
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, err
	}

	var written []string
	for _, format := range o.Formats {
		format = strings.TrimSpace(format)
		pkg, err := nfpm.Get(format)
		if err != nil {
			return written, err
		}
		info, err := cfg.Get(format)
		if err != nil {
			return written, err
		}
		info = nfpm.WithDefaults(info)
		if o.License != "" {
			info.License = o.License
		}
		target := filepath.Join(o.OutDir, pkg.ConventionalFileName(info))
		info.Target = target
		if err := write(target, func(f *os.File) error { return pkg.Package(info, f) }); err != nil {
			return written, fmt.Errorf("%s package: %w", format, err)
		}
		written = append(written, target)
	}
	return written, nil
}

func write(target string, fill func(*os.File) error) error {
	f, err := os.Create(target + ".tmp")
	if err != nil {
		return err
	}
	err = fill(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(target+".tmp", target)
	}
	if err != nil {
		os.Remove(target + ".tmp")
	}
	return err
}

var goarchOf = map[elf.Machine]string{
	elf.EM_X86_64:  "amd64",
	elf.EM_AARCH64: "arm64",
	elf.EM_PPC64:   "ppc64le",
}

// binaryFacts reads the binary's architecture and the newest glibc symbol
// version it needs ("" for a static binary).
func binaryFacts(binary string) (arch, glibc string, err error) {
	f, err := elf.Open(binary)
	if err != nil {
		return "", "", fmt.Errorf("reading %s (run make build first): %w", filepath.Base(binary), err)
	}
	defer f.Close()
	arch, ok := goarchOf[f.Machine]
	if !ok {
		return "", "", fmt.Errorf("%s: unsupported machine %s", binary, f.Machine)
	}
	syms, err := f.DynamicSymbols()
	if err != nil && err != elf.ErrNoSymbols {
		return "", "", fmt.Errorf("%s: %w", binary, err)
	}
	var versions []string
	for _, s := range syms {
		versions = append(versions, s.Version)
	}
	glibc = NewestGLIBC(versions)
	if glibc == "" {
		glibc = "2.17" // static or versionless: any glibc of the last decade
	}
	return arch, glibc, nil
}

// NewestGLIBC is the highest GLIBC_x.y among symbol versions.
func NewestGLIBC(versions []string) string {
	best, bestParts := "", []int(nil)
	for _, v := range versions {
		num, ok := strings.CutPrefix(v, "GLIBC_")
		if !ok {
			continue
		}
		var parts []int
		for _, p := range strings.Split(num, ".") {
			n, err := strconv.Atoi(p)
			if err != nil {
				parts = nil
				break
			}
			parts = append(parts, n)
		}
		if parts == nil {
			continue // GLIBC_PRIVATE
		}
		if bestParts == nil || less(bestParts, parts) {
			best, bestParts = num, parts
		}
	}
	return best
}

func less(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}
