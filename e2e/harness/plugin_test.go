package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseStatusKB(t *testing.T) {
	const status = "Name:\tx\nVmPeak:\t 9 kB\nVmHWM:\t   1234 kB\nVmRSS:\t 5 kB\nRssAnon:\t 3 kB\nRssFile:\t 2 kB\n"
	tests := []struct {
		name    string
		status  string
		key     string
		want    int64
		wantErr bool
	}{
		{name: "kB to bytes", status: status, key: "VmHWM", want: 1234 << 10},
		{name: "the key, not a line starting with it", status: status, key: "VmRSS", want: 5 << 10},
		{name: "RssAnon", status: status, key: "RssAnon", want: 3 << 10},
		{name: "missing line", status: "Name:\tx\n", key: "VmHWM", wantErr: true},
		{name: "unit other than kB", status: "VmHWM:\t 12 MB\n", key: "VmHWM", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatusKB([]byte(tt.status), tt.key)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseStatusKB(%s) = %d, %v; want %d, error %v", tt.key, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParseStatTimes(t *testing.T) {
	tests := []struct {
		name      string
		stat      string
		user, sys time.Duration
		wantErr   bool
	}{
		{
			name: "plain name",
			stat: "42 (gpu-device-plu) S 1 42 42 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 9 0 1000 1 1",
			user: 2500 * time.Millisecond, sys: 310 * time.Millisecond,
		},
		{
			name: "name with blanks and parentheses",
			stat: "42 (a) b (c) R 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 9 0 1000 1 1",
			user: 70 * time.Millisecond, sys: 30 * time.Millisecond,
		},
		{name: "truncated", stat: "42 (x) S 1 2 3", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			user, sys, err := parseStatTimes([]byte(tt.stat))
			if (err != nil) != tt.wantErr || user != tt.user || sys != tt.sys {
				t.Errorf("parseStatTimes = %v, %v, %v; want %v, %v, error %v", user, sys, err, tt.user, tt.sys, tt.wantErr)
			}
		})
	}
}

// TestProcUsageOfSelf reads this test process, which has certainly used
// memory.
func TestProcUsageOfSelf(t *testing.T) {
	u, err := ProcUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.PeakRSS < 1<<20 {
		t.Errorf("peak RSS %d bytes, want at least 1 MiB", u.PeakRSS)
	}
	if u.RSS < 1<<20 || u.RSS > u.PeakRSS || u.RSSAnon+u.RSSFile > u.RSS {
		t.Errorf("RSS %d (anon %d, file %d), peak %d: want at least 1 MiB, at most the peak, and anon+file at most RSS", u.RSS, u.RSSAnon, u.RSSFile, u.PeakRSS)
	}
}

// TestShortTempDir: a TMPDIR too long for socket paths is passed over for /tmp.
func TestShortTempDir(t *testing.T) {
	long := filepath.Join(t.TempDir(), strings.Repeat("long-", 20))
	if err := os.Mkdir(long, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", long)
	dir, err := ShortTempDir("gdp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if len(dir)+1+len(SocketName) >= maxSocketPath {
		t.Errorf("%s leaves no room for %s", dir, SocketName)
	}
}

// TestLogEntries: complete JSON lines are entries; a partial last line and
// lines that are not JSON are not.
func TestLogEntries(t *testing.T) {
	var b syncBuffer
	_, changed := b.entries()
	b.Write([]byte("{\"msg\":\"a\",\"device\":\"GPU-1\",\"n\":3}\ngpu-device-plugin: not json\n{\"msg\":\"b\""))
	select {
	case <-changed:
	default:
		t.Fatal("a write did not signal the reader")
	}
	got, _ := b.entries()
	if len(got) != 1 || got[0].String("device") != "GPU-1" || got[0].String("n") != "3" || got[0].String("absent") != "" {
		t.Fatalf("entries = %v, want only the first line", got)
	}
	b.Write([]byte("}\n"))
	if got, _ := b.entries(); len(got) != 2 || got[1].String("msg") != "b" {
		t.Fatalf("entries after the line completed = %v", got)
	}
}

func TestLogsAboveInfo(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"serve", "--log-level", "warn"}, true},
		{[]string{"--log-level=error"}, true},
		{[]string{"--log-level", "warn", "--log-level", "debug"}, false},
		{[]string{"--log-level=info"}, false},
	} {
		if got := logsAboveInfo(tc.args); got != tc.want {
			t.Errorf("logsAboveInfo(%q) = %v", tc.args, got)
		}
	}
}

// StartCommand runs the binary through its wrapper, in a mount namespace
// of its own when asked, and Usage and the log work as for a plugin.
func TestStartCommandWrapped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a mount namespace of its own")
	}
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Skipf("mount namespaces unavailable: %v", err)
	}
	env, err := exec.LookPath("env")
	if err != nil {
		t.Skip("no env(1)")
	}
	for _, mountNS := range []bool{false, true} {
		t.Run(fmt.Sprintf("mountNamespace=%v", mountNS), func(t *testing.T) {
			p, err := StartCommand(Command{
				Binary: "/bin/sh",
				// The wrapper's variable reaches the binary: env ran it.
				Args:    []string{"-c", `printf '{"msg":"%s %s"}\n' "$(readlink /proc/self/ns/mnt)" "$WRAPPED"; exec sleep 60`},
				Wrapper: []string{env, "WRAPPED=yes"}, MountNamespace: mountNS,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Stop()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			e, err := p.WaitLog(ctx, "its namespace", func(e LogEntry) bool { return e.String("msg") != "" })
			if err != nil {
				t.Fatal(err)
			}
			ns, wrapped, _ := strings.Cut(e.String("msg"), " ")
			if wrapped != "yes" {
				t.Errorf("WRAPPED=%q in the command, want yes: not run through the wrapper", wrapped)
			}
			if (ns != own) != mountNS {
				t.Errorf("mount namespace %s, this process's %s; want its own: %v", ns, own, mountNS)
			}
			if u, err := p.Usage(); err != nil || u.RSS == 0 {
				t.Errorf("Usage = %+v, %v; want the running command's", u, err)
			}
		})
	}
}
