package ocihook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Bounds on what the hook reads: the runtime writes both, but a hook must not be made to
// buffer without limit.
const (
	maxState  = 1 << 20
	maxConfig = 16 << 20
)

// ReadState reads the OCI state that the runtime writes on the hook's stdin.
func ReadState(r io.Reader) (specs.State, error) {
	var st specs.State
	data, err := readBounded(r, maxState)
	if err != nil {
		return st, fmt.Errorf("reading container state from stdin: %w", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("container state on stdin: %w", err)
	}
	if !filepath.IsAbs(st.Bundle) {
		return st, fmt.Errorf("container state on stdin: bundle %q is not an absolute path", st.Bundle)
	}
	return st, nil
}

// RootFS returns the absolute, cleaned root filesystem of the container whose bundle is
// given: root.path of <bundle>/config.json, relative to the bundle unless absolute.
func RootFS(bundle string) (string, error) {
	name := filepath.Join(bundle, "config.json")
	f, err := os.Open(name)
	if err != nil {
		return "", fmt.Errorf("reading bundle config: %w", err)
	}
	defer f.Close()
	data, err := readBounded(f, maxConfig)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", name, err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	if spec.Root == nil || spec.Root.Path == "" {
		return "", fmt.Errorf("%s: root.path is not set", name)
	}
	rootfs := spec.Root.Path
	if !filepath.IsAbs(rootfs) {
		rootfs = filepath.Join(bundle, rootfs)
	}
	rootfs = filepath.Clean(rootfs)
	fi, err := os.Stat(rootfs)
	if err != nil {
		return "", fmt.Errorf("container rootfs: %w", err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("container rootfs %s is not a directory", rootfs)
	}
	return rootfs, nil
}

func readBounded(r io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, errors.New("longer than " + fmt.Sprint(limit) + " bytes")
	}
	return data, nil
}
