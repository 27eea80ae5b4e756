package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/atomicfile"
)

// checkpointVersion is bumped when the file's meaning changes; a file of
// another version is set aside like a corrupt one.
const checkpointVersion = 1

// checkpoint is the file that keeps prepared claims across restarts: the
// kubelet may unprepare a claim that an earlier process prepared, and a
// device must not be prepared for a second claim while the first holds it.
type checkpoint struct {
	Version int                         `json:"version"`
	Claims  map[types.UID]preparedClaim `json:"claims"`
}

type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []preparedDevice `json:"devices"`
}

type preparedDevice struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// AdminAccess devices (monitoring) may be shared with another claim.
	AdminAccess bool `json:"adminAccess,omitempty"`
}

// errCorrupt marks a checkpoint that did not parse and was set aside.
var errCorrupt = errors.New("corrupt DRA checkpoint")

// loadCheckpoint reads path. A missing file is an empty checkpoint. A file
// that does not parse is renamed to path+".corrupt" and reported in err
// next to an empty checkpoint, so the plugin serves on (and says so)
// instead of crash-looping on a file only a person can judge.
func loadCheckpoint(path string) (checkpoint, error) {
	empty := checkpoint{Version: checkpointVersion, Claims: map[types.UID]preparedClaim{}}
	if path == "" {
		return empty, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return empty, nil
	}
	if err != nil {
		return empty, fmt.Errorf("reading DRA checkpoint %s: %w", path, err)
	}
	var c checkpoint
	perr := json.Unmarshal(data, &c)
	if perr == nil && c.Version != checkpointVersion {
		perr = fmt.Errorf("version %d, want %d", c.Version, checkpointVersion)
	}
	if perr == nil {
		if c.Claims == nil {
			c.Claims = empty.Claims
		}
		return c, nil
	}
	aside := path + ".corrupt"
	if err := os.Rename(path, aside); err != nil {
		return empty, fmt.Errorf("DRA checkpoint %s is unreadable (%v) and could not be set aside: %w", path, perr, err)
	}
	return empty, fmt.Errorf("%w: %s does not parse (%v); moved to %s and starting with no prepared claims: claims prepared before are prepared again when their pods start", errCorrupt, path, perr, aside)
}

// save writes the checkpoint atomically and durably: a claim is reported
// prepared only once it is on disk.
func (c checkpoint) save(path string) error {
	if path == "" {
		return errors.New("no DRA checkpoint path: this driver only previews devices and prepares no claims")
	}
	data, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encoding DRA checkpoint: %w", err)
	}
	if _, err := atomicfile.Write(path, data, atomicfile.Options{Mode: 0o600, Sync: true}); err != nil {
		return fmt.Errorf("writing DRA checkpoint %s: %w", path, err)
	}
	return nil
}
