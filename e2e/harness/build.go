package harness

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// ModulePath is the plugin's Go module, whose root holds cmd/gpu-device-plugin.
const ModulePath = "github.com/gpu-device-plugin/gpu-device-plugin"

// BinaryName is the file BuildPlugin writes.
const BinaryName = "gpu-device-plugin"

// RepoRoot returns the directory of the plugin's main module. It asks the
// go tool (the e2e module replaces the main module with ../, so this works
// from anywhere inside either module) and falls back to walking up from
// the working directory to a go.mod declaring ModulePath.
func RepoRoot() (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", ModulePath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); dir != "" {
			return dir, nil
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if declares(filepath.Join(dir, "go.mod"), ModulePath) {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("finding the repository root: no go.mod for %s above %s (go list: %s)", ModulePath, wd, strings.TrimSpace(stderr.String()))
		}
	}
}

// declares reports whether the go.mod at path declares module mod.
func declares(path, mod string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(name), `"`) == mod
		}
	}
	return false
}

// BuildPlugin builds cmd/gpu-device-plugin into dir (created if missing),
// with gpu-device-plugin-dp beside it, which serve execs in device-plugin
// mode as it does where the image and the packages install it; it returns
// the plugin's path. The build cache makes a repeat build cheap.
// CGO_CFLAGS defaults to the Makefile's, which silences go-nvml's
// deprecation warnings.
func BuildPlugin(dir string) (string, error) {
	return buildPlugin(dir, "./cmd/gpu-device-plugin", "./cmd/gpu-device-plugin-dp")
}

// BuildPluginDRA builds cmd/gpu-device-plugin and, beside it, the DRA
// executable serve execs in DRA mode and the ComputeDomain controller
// (gpu-device-plugin-controller), as the image installs them; it returns
// the plugin's path.
func BuildPluginDRA(dir string) (string, error) {
	return buildPlugin(dir, "./cmd/gpu-device-plugin", "./cmd/gpu-device-plugin-dra", "./cmd/gpu-device-plugin-controller")
}

func buildPlugin(dir string, pkgs ...string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("building the plugin: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("building the plugin: %w", err)
	}
	bin, err := filepath.Abs(filepath.Join(dir, BinaryName))
	if err != nil {
		return "", fmt.Errorf("building the plugin: %w", err)
	}
	dst := bin
	if len(pkgs) > 1 {
		dst = filepath.Dir(bin) + string(filepath.Separator) // each package's binary by its name
	}
	cmd := exec.Command("go", append([]string{"build", "-tags", BuildTags, "-o", dst}, pkgs...)...)
	cmd.Dir = root
	cmd.Env = os.Environ()
	if os.Getenv("CGO_CFLAGS") == "" {
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the plugin in %s: %w\n%s", root, err, out)
	}
	return bin, nil
}

// BuildMock builds the mock libnvidia-ml.so.1 into dir and returns its path.
func BuildMock(dir string) (string, error) {
	return mocknvml.Build(dir)
}

// ProfilePath returns the path of a machine profile: name is one of
// e2e/profiles (dgx-h100, pcie-4gpu, hgx-16), or a path to a .profile file.
func ProfilePath(name string) (string, error) {
	if strings.HasSuffix(name, ".profile") || strings.ContainsRune(name, filepath.Separator) {
		if _, err := os.Stat(name); err != nil {
			return "", fmt.Errorf("profile: %w", err)
		}
		return filepath.Abs(name)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, "e2e", "profiles", name+".profile")
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			entries, _ := filepath.Glob(filepath.Join(root, "e2e", "profiles", "*.profile"))
			var names []string
			for _, e := range entries {
				names = append(names, strings.TrimSuffix(filepath.Base(e), ".profile"))
			}
			return "", fmt.Errorf("profile %q: no %s (known: %s)", name, p, strings.Join(names, ", "))
		}
		return "", fmt.Errorf("profile: %w", err)
	}
	return p, nil
}

// maxSocketPath is the room sun_path leaves for a unix socket path,
// counting its terminating NUL.
const maxSocketPath = 108

// longestSocketName is the longest socket name the harness expects in a
// plugin directory ("nvidia.com_gpu.sock", "kubelet.sock"), with room to spare.
const longestSocketName = 40

// ShortTempDir makes a fresh directory whose socket paths fit in sun_path:
// under $TMPDIR when that is short enough, else under /tmp. The caller
// removes it.
func ShortTempDir(prefix string) (string, error) {
	for _, parent := range []string{os.TempDir(), "/tmp"} {
		dir, err := os.MkdirTemp(parent, prefix)
		if err != nil {
			continue
		}
		if len(dir)+1+longestSocketName < maxSocketPath {
			return dir, nil
		}
		os.Remove(dir)
	}
	return "", fmt.Errorf("no temporary directory short enough for unix sockets (TMPDIR=%s)", os.TempDir())
}

// BuildMockR470 builds the mock library as an R470-era driver (see
// mocknvml.BuildR470) into dir and returns its path. Give it a directory of
// its own: both builds are named libnvidia-ml.so.1.
func BuildMockR470(dir string) (string, error) {
	return mocknvml.BuildR470(dir)
}

// BuildTags are the Makefile's GOTAGS, so the harness measures what ships:
// they leave out code that only costs resident memory.
const BuildTags = "urfave_cli_no_docs,grpcnotrace"
