// Package handoff passes serve's resolved configuration from
// gpu-device-plugin to the executable that serves the chosen kubelet API,
// which replaces it: gpu-device-plugin-dp (device-plugin mode) or
// gpu-device-plugin-dra (DRA mode). Each is a program of its own so that
// the daemon links only what its API needs: not the Kubernetes client
// code in device-plugin mode, and not the CLI in either
// (docs/architecture.md, "Where the memory goes").
package handoff

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/cudaprobe"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/launcher"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/mpsd/mpsexec"
)

// The executables serve hands over to, by kubelet API.
const (
	DevicePlugin = "gpu-device-plugin-dp"
	DRA          = "gpu-device-plugin-dra"
)

// Controller is the ComputeDomain controller's executable, installed
// beside the others. gpu-device-plugin-dra execs it for charts of earlier
// releases, which ran `gpu-device-plugin-dra compute-domain-controller`.
const Controller = "gpu-device-plugin-controller"

// Flag carries the merged configuration (file, environment, flags) as
// JSON, so that the CLI alone reads settings, and reads them one way.
const Flag = "--resolved-config"

// Executable is the program that serves api (config.KubeletAPI*).
func Executable(api string) string {
	if api == config.KubeletAPIDRA {
		return DRA
	}
	return DevicePlugin
}

// ErrNotInstalled is Find's error when name is in neither place it looks.
var ErrNotInstalled = errors.New("the image and the packages install it beside gpu-device-plugin")

// Find is the path of name beside this executable (symbolic links
// resolved), where the image and the packages install it; with path
// also on $PATH. The device-plugin executable is looked for beside this
// one only: a test binary, or a copy of gpu-device-plugin alone, then
// serves in its own process rather than running whatever is on $PATH.
func Find(name string, path bool) (string, error) {
	if self, err := os.Executable(); err == nil {
		if self, err = filepath.EvalSymlinks(self); err == nil {
			p := filepath.Join(filepath.Dir(self), name)
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
	}
	if !path {
		return "", fmt.Errorf("%s is not beside this executable; %w", name, ErrNotInstalled)
	}
	p, err := exec.LookPath(name)
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%s is neither beside this executable nor on $PATH; %w", name, ErrNotInstalled)
	}
	return p, err
}

// Exec replaces this process with the executable at path (found by Find)
// that serves cfg.KubeletAPI, keeping its PID, so that signals and the
// container's lifetime carry over. It returns only on failure.
func Exec(cfg config.Config, path string) error {
	name := Executable(cfg.KubeletAPI)
	js, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("kubeletAPI %s: encoding the configuration for %s: %w", cfg.KubeletAPI, name, err)
	}
	err = syscall.Exec(path, []string{name, Flag, string(js)}, os.Environ())
	return fmt.Errorf("kubeletAPI %s: starting %s: %w", cfg.KubeletAPI, path, err)
}

// Read is the configuration gpu-device-plugin passed to the executable
// that serves api: the JSON after Flag, validated again.
func Read(args []string, api string) (config.Config, error) {
	cfg := config.Default()
	if len(args) != 2 || args[0] != Flag {
		return cfg, fmt.Errorf("run `gpu-device-plugin serve --kubelet-api=%s` (or kubeletAPI: %s in its config), which starts this program with its configuration", api, api)
	}
	if err := json.Unmarshal([]byte(args[1]), &cfg); err != nil {
		return cfg, fmt.Errorf("%s: %w", Flag, err)
	}
	if cfg.KubeletAPI != api {
		return cfg, fmt.Errorf("%s: kubeletAPI is %q; this program serves only %q", Flag, cfg.KubeletAPI, api)
	}
	return cfg, daemon.ValidateConfig(cfg, nil)
}

// RunIfHelper, when this process was started as one of the helpers the
// daemon runs through its own executable (os.Executable), runs it and
// exits; it returns otherwise. The MPS control daemons, the launcher's
// client and the CUDA probe are started that way. Both daemons call it
// first; gpu-device-plugin has them as hidden commands.
func RunIfHelper() {
	mpsexec.RunIfHelper()
	launcher.RunIfHelper()
	cudaprobe.RunIfHelper()
}
