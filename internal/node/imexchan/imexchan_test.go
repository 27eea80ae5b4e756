package imexchan

import (
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/imex"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/logtest"
)

const (
	withIMEX    = "Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\n235 nvidia-caps\n"
	withoutIMEX = "Character devices:\n195 nvidia\n235 nvidia-caps\n"
)

func proc(t *testing.T, devices string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "devices"), []byte(devices), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestProvide(t *testing.T) {
	if got, err := Provide(Options{Required: true, ProcRoot: t.TempDir(), DevRoot: t.TempDir()}, nil); got != nil || err != nil {
		t.Errorf("no channel asked for: %v, %v; want nothing, not even a look at /proc", got, err)
	}
	t.Run("no IMEX support, required: one error naming the key and the fix", func(t *testing.T) {
		_, err := Provide(Options{IDs: []int{0}, Required: true, ProcRoot: proc(t, withoutIMEX), DevRoot: t.TempDir()}, nil)
		if err == nil || !strings.Contains(err.Error(), "imex.required is true") || !strings.Contains(err.Error(), "lists no nvidia-caps-imex-channels") || !strings.Contains(err.Error(), "set imex.required to false") || strings.Contains(err.Error(), "\n") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("no IMEX support, not required: a warning, no channel", func(t *testing.T) {
		var logs logtest.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		got, err := Provide(Options{IDs: []int{0}, ProcRoot: proc(t, withoutIMEX), DevRoot: t.TempDir()}, log)
		if got != nil || err != nil {
			t.Errorf("got %v, %v; want no channel, no error", got, err)
		}
		if !strings.Contains(logs.String(), "IMEX channels not injected") {
			t.Errorf("no warning: %s", logs.String())
		}
	})
	t.Run("no devices file, required", func(t *testing.T) {
		if _, err := Provide(Options{IDs: []int{0}, Required: true, ProcRoot: t.TempDir(), DevRoot: t.TempDir()}, nil); err == nil || !strings.Contains(err.Error(), "reading the nvidia-caps-imex-channels major") {
			t.Errorf("got %v", err)
		}
	})
	if os.Geteuid() != 0 {
		t.Skip("the rest makes channel nodes, which needs root (CAP_MKNOD)")
	}
	t.Run("made", func(t *testing.T) {
		dev := t.TempDir()
		got, err := Provide(Options{IDs: []int{0}, Required: true, ProcRoot: proc(t, withIMEX), DevRoot: dev}, nil)
		if err != nil || !reflect.DeepEqual(got, []int{0}) {
			t.Fatalf("got %v, %v; want [0]", got, err)
		}
		if ids, _ := imex.Channels(dev); !reflect.DeepEqual(ids, []int{0}) {
			t.Errorf("nodes %v; want channel0", ids)
		}
	})
	t.Run("a file in the way", func(t *testing.T) {
		dev := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dev, imex.DeviceName), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dev, imex.DeviceName, "channel0"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Provide(Options{IDs: []int{0}, Required: true, ProcRoot: proc(t, withIMEX), DevRoot: dev}, nil); err == nil || !strings.Contains(err.Error(), "IMEX channel 0 cannot be given") {
			t.Errorf("required: %v", err)
		}
		if got, err := Provide(Options{IDs: []int{0}, ProcRoot: proc(t, withIMEX), DevRoot: dev}, nil); got != nil || err != nil {
			t.Errorf("not required: %v, %v; want no channel", got, err)
		}
	})
}

// Preview says what Provide would do and makes nothing.
func TestPreview(t *testing.T) {
	if got := Preview(Options{ProcRoot: t.TempDir(), DevRoot: t.TempDir()}); got != nil {
		t.Errorf("no channel asked for: %v", got)
	}
	inWay := t.TempDir()
	if err := os.MkdirAll(filepath.Join(inWay, imex.DeviceName), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(inWay, imex.DeviceName, "channel0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		devices   string
		dev       string
		given     bool
		reasonHas string
	}{
		{name: "IMEX support, no node yet: given, serve makes it", devices: withIMEX, dev: t.TempDir(), given: true},
		{name: "no IMEX support: not given, why", devices: withoutIMEX, dev: t.TempDir(), reasonHas: "the driver has no IMEX support"},
		{name: "a file in the way: not given, remove it", devices: withIMEX, dev: inWay, reasonHas: "remove it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Preview(Options{IDs: []int{0}, Required: true, ProcRoot: proc(t, tc.devices), DevRoot: tc.dev})
			if len(got) != 1 || got[0].ID != 0 || got[0].Path != "/dev/nvidia-caps-imex-channels/channel0" || got[0].Given != tc.given || got[0].Present {
				t.Fatalf("got %+v; want channel 0, given %t, not present", got, tc.given)
			}
			if !strings.Contains(got[0].Reason, tc.reasonHas) || (tc.given && got[0].Reason != "") {
				t.Errorf("reason %q; want it to say %q", got[0].Reason, tc.reasonHas)
			}
		})
	}
	if entries, _ := os.ReadDir(filepath.Join(inWay, imex.DeviceName)); len(entries) != 1 {
		t.Errorf("Preview changed %s: %v", inWay, entries)
	}
	if os.Geteuid() != 0 {
		t.Skip("a node in place needs root (CAP_MKNOD)")
	}
	dev, procRoot := t.TempDir(), proc(t, withIMEX)
	if _, err := Provide(Options{IDs: []int{0}, ProcRoot: procRoot, DevRoot: dev}, nil); err != nil {
		t.Fatal(err)
	}
	if got := Preview(Options{IDs: []int{0}, ProcRoot: procRoot, DevRoot: dev}); len(got) != 1 || !got[0].Given || !got[0].Present {
		t.Errorf("after Provide: %+v; want given and present", got)
	}
}
