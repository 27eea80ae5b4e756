package sharing

import (
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/resname"
)

// Resource gives the devices of one served resource replicas: one entry of
// a sharing section.
type Resource struct {
	// Name is the resource as served: nvidia.com/gpu or
	// nvidia.com/mig-<profile>.
	Name string
	// Rename is the resource to serve the replicas under; empty: Name (or
	// Name+".shared" with RenameByDefault).
	Rename string
	// Replicas is how many containers may hold each device.
	Replicas int
	// Devices are UUIDs or model names; empty: every device of the
	// resource that no other entry names.
	Devices []string
}

// Rules are one way of sharing's entries: time-slicing's or MPS's.
type Rules struct {
	// RenameByDefault serves replicas under <name>.shared when an entry
	// has no Rename.
	RenameByDefault bool
	Resources       []Resource
}

// Enabled says whether any device is shared this way.
func (r Rules) Enabled() bool { return len(r.Resources) > 0 }

// Replicas returns how many replicas a device gets and the resource name
// to serve them under, for a device of resource `resource` with UUID uuid
// and model name model. Precedence: an entry naming the UUID, then one
// naming the model, then one with no devices; no entry: (1, resource).
// Name when replicated: ServedName. UUIDs and models match in any case.
func (r Rules) Replicas(resource, uuid, model string) (replicas int, name string) {
	var byUUID, byModel, catchAll *Resource
	for i := range r.Resources {
		e := &r.Resources[i]
		if e.Name != resource {
			continue
		}
		if len(e.Devices) == 0 {
			catchAll = firstOf(catchAll, e)
			continue
		}
		for _, d := range e.Devices {
			switch {
			case uuid != "" && strings.EqualFold(d, uuid):
				byUUID = firstOf(byUUID, e)
			case model != "" && strings.EqualFold(d, model):
				byModel = firstOf(byModel, e)
			}
		}
	}
	e := firstOf(firstOf(byUUID, byModel), catchAll)
	if e == nil {
		return 1, resource
	}
	return e.Replicas, ServedName(*e, r.RenameByDefault)
}

// firstOf is a if set, else b: the first match in file order wins
// (validation refuses the overlaps that would make order matter).
func firstOf(a, b *Resource) *Resource {
	if a != nil {
		return a
	}
	return b
}

// ServedName is the resource an entry's replicas are served under: Rename
// if set, else Name+".shared" when renameByDefault, else Name.
func ServedName(r Resource, renameByDefault bool) string {
	switch {
	case r.Rename != "":
		return r.Rename
	case renameByDefault:
		return r.Name + resname.SharedSuffix
	}
	return r.Name
}

// TimeSlicing serves each selected device as several replicas, which the
// driver time-slices between the containers holding them. It shapes the
// device-plugin API only.
type TimeSlicing struct {
	Rules
	// Placement is how preferred allocations place replicas: gpu's
	// PlacementDistributed (empty) or PlacementPacked.
	Placement string
	// FailRequestsGreaterThanOne refuses a request for more than one
	// replica.
	FailRequestsGreaterThanOne bool
}

// MPS serves each selected GPU as several replicas shared through an MPS
// control daemon per GPU.
type MPS struct {
	Rules
	// MaxSharesPerContainer is the most shares of a GPU one container may
	// hold; 0 means 1.
	MaxSharesPerContainer int
}

// SharesPerContainer is MaxSharesPerContainer, 1 when unset: the most
// shares a container may hold, and each client's limit at the daemon.
func (m MPS) SharesPerContainer() int { return max(m.MaxSharesPerContainer, 1) }
