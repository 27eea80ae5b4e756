package nvcaps

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
)

// capsDir is where the driver lists capabilities, relative to procfs.
const capsDir = "driver/nvidia/capabilities"

// nodeDir is where capability device nodes live, on the host and in a
// container alike.
const nodeDir = "/dev/nvidia-caps"

// NodePath returns the path of capability device minor in a container:
// "/dev/nvidia-caps/nvidia-cap<minor>".
func NodePath(minor int) string {
	return nodeDir + "/nvidia-cap" + strconv.Itoa(minor)
}

// AddMIG returns gpus with each MIG device's CapMinors set to its GPU
// instance's access minor, then its compute instance's, read under
// procRoot (normally "/proc") for the parent's minor number. gpus is not
// modified: the result has MIG slices of its own.
//
// A MIG device whose capabilities cannot be read is left out, with one
// error naming the file: a container given it could not open it. The
// other devices, and the GPUs themselves, are unaffected.
func AddMIG(procRoot string, gpus []nvml.GPU, log *slog.Logger) []nvml.GPU {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	out := make([]nvml.GPU, len(gpus))
	for i, g := range gpus {
		out[i] = g
		if len(g.MIG) == 0 {
			continue
		}
		migs := make([]nvml.MIGDevice, 0, len(g.MIG))
		for _, m := range g.MIG {
			minors, err := MIGMinors(procRoot, g.Minor, m.GPUInstance, m.ComputeInstance)
			if err != nil {
				log.Error("MIG device's access capability unreadable; it is not served (a container could not open it)",
					"device", g.UUID, "mig", m.UUID, "gpuInstance", m.GPUInstance, "computeInstance", m.ComputeInstance, "reason", err.Error())
				continue
			}
			m.CapMinors = minors
			migs = append(migs, m)
		}
		out[i].MIG = migs
	}
	return out
}

// MIGMinors reads the GPU instance and compute instance access minors of
// MIG device gi/ci of the GPU with minor number gpuMinor.
func MIGMinors(procRoot string, gpuMinor, gi, ci int) ([]int, error) {
	giDir := filepath.Join(procRoot, capsDir, "gpu"+strconv.Itoa(gpuMinor), "mig", "gi"+strconv.Itoa(gi))
	giMinor, err := readMinor(filepath.Join(giDir, "access"))
	if err != nil {
		return nil, err
	}
	ciMinor, err := readMinor(filepath.Join(giDir, "ci"+strconv.Itoa(ci), "access"))
	if err != nil {
		return nil, err
	}
	return []int{giMinor, ciMinor}, nil
}

// Global reads the minors of the node-wide MIG capabilities: config
// (create and destroy instances) and monitor (see every instance).
func Global(procRoot string) (config, monitor int, err error) {
	dir := filepath.Join(procRoot, capsDir, "mig")
	if config, err = readMinor(filepath.Join(dir, "config")); err != nil {
		return 0, 0, err
	}
	if monitor, err = readMinor(filepath.Join(dir, "monitor")); err != nil {
		return 0, 0, err
	}
	return config, monitor, nil
}

// readMinor parses a capability file. Its "DeviceFileMinor: <N>" line is
// required, once, with N a non-negative integer; other lines are the
// driver's (DeviceFileMode, ...) and skipped. Every error names the file.
func readMinor(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading capability %s: %w", path, err)
	}
	minor, err := parseMinor(data)
	if err != nil {
		return 0, fmt.Errorf("capability %s is malformed: %w", path, err)
	}
	return minor, nil
}

func parseMinor(data []byte) (int, error) {
	minor, found := -1, false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(key) != "DeviceFileMinor" {
			continue
		}
		if found {
			return 0, errors.New("more than one DeviceFileMinor line")
		}
		n, err := strconv.Atoi(strings.TrimSpace(value))
		if err != nil || n < 0 {
			return 0, fmt.Errorf("DeviceFileMinor %q is not a minor number", strings.TrimSpace(value))
		}
		minor, found = n, true
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, errors.New("no DeviceFileMinor line")
	}
	return minor, nil
}
