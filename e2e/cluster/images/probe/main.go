// Command probe is the end-to-end test container: it prints, as one JSON
// line, what a GPU workload would look for (the NVIDIA_* and PCIDEVICE_*
// environment, the /dev/nvidia* nodes with their numbers, and any files
// named by -look-for), then waits for SIGTERM.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
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
	flag.Parse()

	r := Report{Env: map[string]string{}, Files: map[string]bool{}}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NVIDIA_") || strings.HasPrefix(k, "PCIDEVICE_") {
			r.Env[k] = v
		}
	}
	var paths []string
	for _, pattern := range []string{"/dev/nvidia*", "/dev/infiniband/*"} {
		m, _ := filepath.Glob(pattern)
		paths = append(paths, m...)
	}
	sort.Strings(paths)
	for _, p := range paths {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			continue
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
	b, _ := json.Marshal(r)
	fmt.Printf("probe: %s\n", b)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
