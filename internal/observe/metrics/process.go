package metrics

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/metrics/exposition"
)

// Process is the collector of this process's series that dashboards use,
// named, typed and meant as client_golang's process collector has them:
// process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_start_time_seconds,
// process_open_fds and process_max_fds. They are read at each scrape from
// proc (/proc; a test's tree): self/stat, self/fd, self/limits and, for
// the boot time, stat. A file that cannot be read leaves its series out.
func Process(proc string) exposition.Collector {
	gauge := func(name, help string) *exposition.Desc {
		return &exposition.Desc{Name: name, Help: help, Type: exposition.TypeGauge}
	}
	return process{
		proc: proc,
		cpu: &exposition.Desc{Name: "process_cpu_seconds_total",
			Help: "Total user and system CPU time spent in seconds.",
			Type: exposition.TypeCounter},
		rss:     gauge("process_resident_memory_bytes", "Resident memory size in bytes."),
		vsize:   gauge("process_virtual_memory_bytes", "Virtual memory size in bytes."),
		start:   gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds."),
		openFDs: gauge("process_open_fds", "Number of open file descriptors."),
		maxFDs:  gauge("process_max_fds", "Maximum number of open file descriptors."),
	}
}

type process struct {
	proc                                    string
	cpu, rss, vsize, start, openFDs, maxFDs *exposition.Desc
}

func (c process) Describe() []*exposition.Desc {
	return []*exposition.Desc{c.cpu, c.rss, c.vsize, c.start, c.openFDs, c.maxFDs}
}

// userHZ is the unit of /proc's clock ticks: USER_HZ, 100 on every
// architecture the plugin is built for, whatever the kernel's HZ.
const userHZ = 100

func (c process) Collect(s *exposition.Scrape) {
	if st, err := readProcStat(filepath.Join(c.proc, "self", "stat")); err == nil {
		s.Add(c.cpu, float64(st.utime+st.stime)/userHZ)
		s.Add(c.vsize, float64(st.vsize))
		s.Add(c.rss, float64(st.rss)*float64(os.Getpagesize()))
		if boot, err := bootTime(filepath.Join(c.proc, "stat")); err == nil {
			s.Add(c.start, float64(boot)+float64(st.starttime)/userHZ)
		}
	}
	if n, err := countFDs(filepath.Join(c.proc, "self", "fd")); err == nil {
		s.Add(c.openFDs, float64(n))
	}
	if n, err := maxOpenFiles(filepath.Join(c.proc, "self", "limits")); err == nil {
		s.Add(c.maxFDs, n)
	}
}

// procStat is what is used of /proc/<pid>/stat (proc(5)).
type procStat struct {
	utime, stime, starttime uint64 // clock ticks
	vsize                   uint64 // bytes
	rss                     uint64 // pages
}

func readProcStat(path string) (procStat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return procStat{}, err
	}
	// The command name, in parentheses, may hold spaces and parentheses:
	// the fields are counted from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("%s: no (comm) field", path)
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3, state
	if len(f) < 22 {
		return procStat{}, fmt.Errorf("%s: %d fields after (comm), want at least 22", path, len(f))
	}
	var st procStat
	for _, v := range []struct {
		field int // as proc(5) numbers them
		to    *uint64
	}{{14, &st.utime}, {15, &st.stime}, {22, &st.starttime}, {23, &st.vsize}, {24, &st.rss}} {
		if *v.to, err = strconv.ParseUint(f[v.field-3], 10, 64); err != nil {
			return procStat{}, fmt.Errorf("%s: field %d: %w", path, v.field, err)
		}
	}
	return st, nil
}

// bootTime is btime of /proc/stat: when the system booted, in seconds
// since the epoch.
func bootTime(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	// The intr line lists every interrupt: long on a large machine.
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "btime "); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: btime: %w", path, err)
			}
			return n, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading %s: %w", path, err)
	}
	return 0, fmt.Errorf("%s: no btime line", path)
}

// countFDs counts the entries of /proc/self/fd: the open descriptors, the
// one reading it included, as client_golang counts them.
func countFDs(dir string) (int, error) {
	d, err := os.Open(dir)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", dir, err)
	}
	return len(names), nil
}

// maxOpenFiles is the soft limit on open files in /proc/self/limits;
// unlimited is the largest uint64, as client_golang has it.
func maxOpenFiles(path string) (float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "Max open files")
		if !ok {
			continue
		}
		f := strings.Fields(rest) // soft, hard, units
		if len(f) == 0 {
			break
		}
		if f[0] == "unlimited" {
			return math.MaxUint64, nil
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: Max open files: %w", path, err)
		}
		return float64(n), nil
	}
	return 0, errors.New(path + ": no Max open files line")
}
