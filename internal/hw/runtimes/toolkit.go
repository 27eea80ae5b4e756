package runtimes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// toolkit is what the NVIDIA Container Toolkit's config says about the
// variable.
type toolkit struct {
	path string // host path
	// acceptEnvvar is KeyAcceptEnvvar; true when unset, as in the toolkit.
	acceptEnvvar bool
	mode         string
}

// readToolkit reads the config that NVIDIA's runtime or hook at binary
// uses. The GPU Operator installs a wrapper that points the runtime at
// .config/nvidia-container-runtime/config.toml beside it; otherwise it is
// ToolkitConfig. A missing file is the toolkit's defaults: the variable
// accepted.
func readToolkit(root, binary string) (toolkit, error) {
	tk := toolkit{path: ToolkitConfig, acceptEnvvar: true, mode: "auto"}
	if filepath.IsAbs(binary) {
		beside := filepath.Join(filepath.Dir(binary), ".config", "nvidia-container-runtime", "config.toml")
		if _, err := os.Stat(under(root, beside)); err == nil {
			tk.path = beside
		} else if !errors.Is(err, fs.ErrNotExist) {
			return tk, err
		}
	}
	t, err := readTOML(root, tk.path)
	if err != nil || t == nil {
		return tk, err
	}
	switch v := lookup(t, KeyAcceptEnvvar).(type) {
	case nil:
	case bool:
		tk.acceptEnvvar = v
	default:
		return tk, fmt.Errorf("%s: %s is %v, not true or false", tk.path, KeyAcceptEnvvar, v)
	}
	if m := str(t, "nvidia-container-runtime", "mode"); m != "" {
		tk.mode = m
	}
	return tk, nil
}
