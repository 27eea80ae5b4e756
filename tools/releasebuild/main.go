// Command releasebuild makes, checks and publishes a release folder (make
// release, make push; docs/development.md, Releases). make builds every
// platform's binaries, image (imagebuild) and packages (pkgbuild) first.
//
//	releasebuild assemble -version v0.1.0 -dir bin/release/v0.1.0 -work bin/release-work/v0.1.0 -chart deploy/helm/gpu-device-plugin
//	releasebuild verify -version v0.1.0 -dir bin/release/v0.1.0
//	releasebuild push -version v0.1.0 -dir bin/release/v0.1.0 -image registry.example.com/team/gpu-device-plugin -charts registry.example.com/team/charts
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/tools/release"
)

const usage = `usage: releasebuild assemble|verify|push [flags] (releasebuild <command> -h lists them)`

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("no command; %s", usage))
	}
	cmd, args := os.Args[1], os.Args[2:]
	fs := flag.NewFlagSet("releasebuild "+cmd, flag.ExitOnError)
	dir := fs.String("dir", "", "the release folder")
	vers := fs.String("version", "", "the release's version, as make version prints it (v0.1.0)")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "the platforms the release serves")
	var err error
	switch cmd {
	case "assemble":
		work := fs.String("work", "", "where make built each platform's binaries and image, one folder per platform (linux-arm64)")
		chart := fs.String("chart", "deploy/helm/gpu-device-plugin", "the chart's source")
		repo := fs.String("repository", "ghcr.io/gpu-device-plugin/gpu-device-plugin", "the image's repository, named in the OCI layout")
		parse(fs, args)
		o := release.AssembleOptions{Dir: *dir, Version: *vers, Work: *work, ChartDir: *chart, Repository: *repo}
		if o.Platforms, err = release.ParsePlatforms(*platforms); err != nil {
			fail(err)
		}
		if o.Created, err = sourceDate(os.Getenv("SOURCE_DATE_EPOCH")); err != nil {
			fail(err)
		}
		if err := release.Assemble(o); err != nil {
			fail(err)
		}
		list(*dir)
	case "verify":
		parse(fs, args)
		ps, err := release.ParsePlatforms(*platforms)
		if err != nil {
			fail(err)
		}
		if err := release.Verify(*dir, *vers, ps); err != nil {
			fail(err)
		}
		fmt.Printf("releasebuild: %s: release %s checks out (%s)\n", *dir, *vers, *platforms)
	case "push":
		image := fs.String("image", "", "the image's repository, without a tag: the tag is the release's")
		charts := fs.String("charts", "", "the repository the chart goes under (helm push's oci://...), without the chart's name")
		parse(fs, args)
		o := release.PushOptions{Dir: *dir, Version: *vers, Image: *image, Charts: *charts}
		if o.Platforms, err = release.ParsePlatforms(*platforms); err != nil {
			fail(err)
		}
		res, err := release.Push(context.Background(), o)
		if err != nil {
			fail(err)
		}
		fmt.Printf("releasebuild: pushed %s@%s (%s)\n", res.Image, res.ImageDigest, *platforms)
		fmt.Printf("releasebuild: pushed %s@%s (helm pull oci://%s --version %s)\n", res.Chart, res.ChartDigest, res.Chart.Repository, res.Chart.TagStr())
	default:
		fail(fmt.Errorf("unknown command %q; %s", cmd, usage))
	}
}

func parse(fs *flag.FlagSet, args []string) {
	fs.Parse(args)
	if fs.NArg() > 0 {
		fail(fmt.Errorf("%s: unexpected arguments %q", fs.Name(), fs.Args()))
	}
}

// sourceDate reads SOURCE_DATE_EPOCH, Unix seconds; unset is the epoch.
func sourceDate(v string) (time.Time, error) {
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	secs, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want Unix seconds", v)
	}
	return time.Unix(secs, 0).UTC(), nil
}

// list prints the folder, as a person checks it.
func list(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		fail(err)
	}
	fmt.Printf("releasebuild: %s:\n", dir)
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			fail(err)
		}
		fmt.Printf("  %8.1f MiB  %s\n", float64(fi.Size())/(1<<20), filepath.Join(dir, e.Name()))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "releasebuild:", err)
	os.Exit(1)
}
