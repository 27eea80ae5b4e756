package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/atomicfile"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/jsonkeep"
)

// checkpointVersion is the newest format this release writes. Releases
// read each other's files both ways: fields are only ever added, a reader
// keeps the ones it does not know and writes them back, an older version is
// migrated on load, and a newer one is read for what this release knows
// (its number is kept, so the file still says a newer release wrote it).
const checkpointVersion = 1

// checkpoint is the file that keeps prepared claims across restarts: the
// kubelet may unprepare a claim that an earlier process prepared, and a
// device must not be prepared for a second claim while the first holds it.
type checkpoint struct {
	Version int                         `json:"version"`
	Claims  map[types.UID]preparedClaim `json:"claims"`
	extra   jsonkeep.Fields
}

type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []preparedDevice `json:"devices"`
	extra     jsonkeep.Fields
}

type preparedDevice struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// AdminAccess devices (monitoring) may be shared with another claim.
	AdminAccess bool `json:"adminAccess,omitempty"`
	// ShareID is the allocation's share of a device several claims may
	// hold (sharing.memoryShares).
	ShareID *types.UID `json:"shareID,omitempty"`
	// MPS is set for an MPS client: its limits.
	MPS *preparedMPS `json:"mps,omitempty"`
	// TimeSlice is the time-slice interval set on the GPU for the claim,
	// put back to Default when the claim goes.
	TimeSlice string `json:"timeSlice,omitempty"`
	// MIG is set for a MIG instance the claim's Prepare creates on a
	// partitioned GPU.
	MIG *preparedMIG `json:"mig,omitempty"`
	// Domain is set for a ComputeDomain's IMEX channel: the domain and
	// its channel.
	Domain *preparedDomain `json:"computeDomain,omitempty"`
	// gpu is the GPU's UUID while preparing (not kept).
	gpu   string
	extra jsonkeep.Fields
}

// The JSON methods keep what a newer release wrote (jsonkeep).

func (c *checkpoint) UnmarshalJSON(b []byte) error {
	type plain checkpoint
	return jsonkeep.Unmarshal[plain](b, c, &c.extra)
}

func (c checkpoint) MarshalJSON() ([]byte, error) {
	type plain checkpoint
	return jsonkeep.Marshal[plain](c, c.extra)
}

func (c *preparedClaim) UnmarshalJSON(b []byte) error {
	type plain preparedClaim
	return jsonkeep.Unmarshal[plain](b, c, &c.extra)
}

func (c preparedClaim) MarshalJSON() ([]byte, error) {
	type plain preparedClaim
	return jsonkeep.Marshal[plain](c, c.extra)
}

func (d *preparedDevice) UnmarshalJSON(b []byte) error {
	type plain preparedDevice
	return jsonkeep.Unmarshal[plain](b, d, &d.extra)
}

func (d preparedDevice) MarshalJSON() ([]byte, error) {
	type plain preparedDevice
	return jsonkeep.Marshal[plain](d, d.extra)
}

// errCorrupt marks a checkpoint that did not parse and was set aside.
var errCorrupt = errors.New("corrupt DRA checkpoint")

// loadCheckpoint reads path (see readCheckpoint).
func loadCheckpoint(path string) (checkpoint, error) {
	c, _, err := readCheckpoint(path)
	return c, err
}

// readCheckpoint reads path and says whether the file was there. A missing
// file is an empty checkpoint. A file that does not parse is renamed to
// path+".corrupt" and reported in err (errCorrupt) next to an empty
// checkpoint, so the plugin serves on (and says so) instead of
// crash-looping on a file only a person can judge; the Driver then rebuilds
// the claims it held from the kubelet and the API server.
func readCheckpoint(path string) (checkpoint, bool, error) {
	empty := checkpoint{Version: checkpointVersion, Claims: map[types.UID]preparedClaim{}}
	if path == "" {
		return empty, false, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return empty, false, nil
	}
	if err != nil {
		return empty, true, fmt.Errorf("reading DRA checkpoint %s: %w", path, err)
	}
	var c checkpoint
	perr := json.Unmarshal(data, &c)
	if perr == nil {
		if c.Claims == nil {
			c.Claims = empty.Claims
		}
		// Version 1 is the first format: an older or missing number has
		// nothing to migrate. A newer one keeps its number.
		c.Version = max(c.Version, checkpointVersion)
		return c, true, nil
	}
	aside := path + ".corrupt"
	if err := os.Rename(path, aside); err != nil {
		return empty, true, fmt.Errorf("%w: %s is unreadable (%v) and could not be set aside: %w", errCorrupt, path, perr, err)
	}
	return empty, true, fmt.Errorf("%w: %s does not parse (%v); moved to %s, and the claims it held are rebuilt from the kubelet and the API server", errCorrupt, path, perr, aside)
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
