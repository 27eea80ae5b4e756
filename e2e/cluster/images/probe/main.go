// Command probe is the end-to-end test container: it prints, as one JSON
// line, what a GPU workload would look for (the NVIDIA_*, CUDA_MPS_* and PCIDEVICE_*
// environment, the /dev/nvidia* and /dev/nvidia-caps/* nodes with their numbers, any files named
// by -look-for, the contents of files named by -cat, the targets of links
// named by -links, and the libraries
// the image's own `ldconfig -p` lists, as Triton reads them), then waits
// for SIGTERM, or exits with -exit.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// Report is the probe's one line of output.
type Report struct {
	Env     map[string]string `json:"env"`
	Devices []Device          `json:"devices"`
	Files   map[string]bool   `json:"files,omitempty"`
	// Contents maps each -cat path to its contents ("" when unreadable).
	Contents map[string]string `json:"contents,omitempty"`
	// Links maps each -links path to its target ("" when not a link).
	Links map[string]string `json:"links,omitempty"`
	// LDCache is `ldconfig -p` of the image's ldconfig, line by line,
	// when -ldconfig names one; LDCacheError says why it failed.
	LDCache      []string `json:"ldCache,omitempty"`
	LDCacheError string   `json:"ldCacheError,omitempty"`
}

// Device is one device node the container has.
type Device struct {
	Path  string `json:"path"`
	Char  bool   `json:"char"`
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
}

func main() {
	lookFor := flag.String("look-for", "", "comma-separated paths whose presence to report")
	cat := flag.String("cat", "", "comma-separated files whose contents to report")
	links := flag.String("links", "", "comma-separated paths whose symlink targets to report")
	ldconfig := flag.String("ldconfig", "", "the image's ldconfig, to report `ldconfig -p`")
	exit := flag.Bool("exit", false, "exit after the report instead of waiting for SIGTERM")
	flag.Parse()

	r := Report{Env: map[string]string{}, Files: map[string]bool{}}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NVIDIA_") || strings.HasPrefix(k, "PCIDEVICE_") || strings.HasPrefix(k, "CUDA_MPS_") {
			r.Env[k] = v
		}
	}
	var paths []string
	for _, pattern := range []string{"/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/infiniband/*"} {
		m, _ := filepath.Glob(pattern)
		paths = append(paths, m...)
	}
	sort.Strings(paths)
	for _, p := range paths {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil || st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			continue // the nvidia-caps directory is listed by its nodes
		}
		r.Devices = append(r.Devices, Device{
			Path:  p,
			Char:  st.Mode&syscall.S_IFMT == syscall.S_IFCHR,
			Major: uint32(st.Rdev >> 8 & 0xfff), Minor: uint32(st.Rdev&0xff | st.Rdev>>12&0xfff00),
		})
	}
	for _, p := range strings.Split(*lookFor, ",") {
		if p != "" {
			_, err := os.Stat(p)
			r.Files[p] = err == nil
		}
	}
	for _, p := range strings.Split(*cat, ",") {
		if p != "" {
			if r.Contents == nil {
				r.Contents = map[string]string{}
			}
			b, _ := os.ReadFile(p)
			r.Contents[p] = string(b)
		}
	}
	for _, p := range strings.Split(*links, ",") {
		if p != "" {
			if r.Links == nil {
				r.Links = map[string]string{}
			}
			r.Links[p], _ = os.Readlink(p)
		}
	}
	if *ldconfig != "" {
		out, err := exec.Command(*ldconfig, "-p").CombinedOutput()
		if err != nil {
			r.LDCacheError = fmt.Sprintf("%v: %s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				r.LDCache = append(r.LDCache, l)
			}
		}
	}
	b, _ := json.Marshal(r)
	fmt.Printf("probe: %s\n", b)
	if *exit {
		return
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
