package daemon

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// A state directory that cannot be written is reported when the plugin
// starts, not first when a fatal XID needs keeping.
func TestUnwritableStateDirReportedAtStart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.StateDir = filepath.Join(file, "state")
	cfg.ProcRoot = t.TempDir()
	var logs bytes.Buffer
	keptHealth(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if !strings.Contains(logs.String(), "cannot be kept") || !strings.Contains(logs.String(), "--state-dir") {
		t.Errorf("no warning at start naming the setting:\n%s", logs.String())
	}
}
