package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// RunCommand runs the plugin binary once, for a command that looks at the
// node and exits (list, version), on a mock machine: sysfs, /dev and the
// driver's MIG capability files in /proc are written from the profile
// into a temporary directory, and the mock
// library is loaded through --nvml-library. args follow the command name
// and the harness's flags. It returns stdout and stderr; err is set when
// the process fails or exits non-zero.
func RunCommand(ctx context.Context, binary, library, profile, command string, args ...string) (stdout, stderr string, err error) {
	prof, err := mocknvml.LoadProfile(profile)
	if err != nil {
		return "", "", fmt.Errorf("running %s: %w", command, err)
	}
	work, err := os.MkdirTemp("", "gdp-cmd")
	if err != nil {
		return "", "", fmt.Errorf("running %s: %w", command, err)
	}
	defer os.RemoveAll(work)
	sys, dev, proc := filepath.Join(work, "sys"), filepath.Join(work, "dev"), filepath.Join(work, "proc")
	for root, write := range map[string]func(string) error{sys: prof.WriteSysfs, dev: prof.WriteDev, proc: prof.WriteProc} {
		if err := write(root); err != nil {
			return "", "", fmt.Errorf("running %s: %w", command, err)
		}
	}
	// The settings before the command: the top level takes them all.
	full := append([]string{"--nvml-library", library, "--sysfs-root", sys, "--dev-root", dev, "--proc-root", proc, command}, args...)
	cmd := exec.CommandContext(ctx, binary, full...)
	cmd.Env = append(pluginEnv(os.Environ()), "MOCK_NVML_PROFILE="+profile)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), errb.String(), fmt.Errorf("%s %s: %w\n%s", binary, command, err, errb.String())
	}
	return out.String(), errb.String(), nil
}
