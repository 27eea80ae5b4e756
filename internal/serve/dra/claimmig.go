package dra

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/jsonkeep"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
)

// MIGInstances creates and destroys the MIG instances of partitioned GPUs
// (sharing.migPartitions). The MIG devices it returns have their
// capability minors, and their nodes exist on the host.
type MIGInstances interface {
	// Create makes a GPU instance at p on g, with one compute instance
	// spanning it.
	Create(g nvml.GPU, p nvml.MIGPlacement) (nvml.MIGDevice, error)
	// Find reads the MIG device of GPU instance gi on g; false when the
	// GPU instance is gone.
	Find(g nvml.GPU, gi int) (nvml.MIGDevice, bool, error)
	// Destroy removes GPU instance gi of g; one already gone is no error.
	Destroy(g nvml.GPU, gi int) error
	// Instances lists the GPU instances on g.
	Instances(g nvml.GPU) ([]nvml.GPUInstance, error)
}

// MIGSpec writes the cdi.MIGKind spec holding devs (none: removes it) and
// says whether it is on disk.
type MIGSpec func(devs []cdi.Device) error

// preparedMIG is a MIG instance a claim's Prepare creates. It is in the
// checkpoint before the instance is created: an entry without a UUID is
// one whose creation was under way, which a restart destroys (the claim
// was never reported prepared, so no container uses it).
type preparedMIG struct {
	GPU          string `json:"gpu"` // the parent's UUID
	Profile      string `json:"profile"`
	ProfileIndex int    `json:"profileIndex"`
	ProfileID    uint32 `json:"profileID"`
	Start        int    `json:"start"`
	Size         int    `json:"size"`
	// Set once the instance exists.
	UUID            string `json:"uuid,omitempty"`
	GPUInstance     int    `json:"gpuInstance"`
	ComputeInstance int    `json:"computeInstance"`
	CapMinors       []int  `json:"capMinors,omitempty"`
	extra           jsonkeep.Fields
}

func (p *preparedMIG) UnmarshalJSON(b []byte) error {
	type plain preparedMIG
	return jsonkeep.Unmarshal[plain](b, p, &p.extra)
}

func (p preparedMIG) MarshalJSON() ([]byte, error) {
	type plain preparedMIG
	return jsonkeep.Marshal[plain](p, p.extra)
}

func (p *preparedMIG) placement() nvml.MIGPlacement {
	return nvml.MIGPlacement{ProfileIndex: p.ProfileIndex, ProfileID: p.ProfileID, Profile: p.Profile, Start: p.Start, Size: p.Size}
}

func (p *preparedMIG) device() nvml.MIGDevice {
	return nvml.MIGDevice{UUID: p.UUID, GPUInstance: p.GPUInstance, ComputeInstance: p.ComputeInstance, Profile: p.Profile, CapMinors: p.CapMinors}
}

func (p *preparedMIG) created(m nvml.MIGDevice) {
	p.UUID, p.GPUInstance, p.ComputeInstance, p.CapMinors = m.UUID, m.GPUInstance, m.ComputeInstance, slices.Clone(m.CapMinors)
}

// SetMIG starts creating MIG instances through m for claims of partitioned
// GPUs, writing their CDI spec through spec. The spec is rewritten now
// from the checkpoint (a reboot empties /var/run/cdi); instances whose
// creation a stopped process left under way are destroyed at the next
// Prepare or Unprepare, which the kubelet plugin helper serialises with
// any other process serving beside this one.
func (d *Driver) SetMIG(m MIGInstances, spec MIGSpec) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mig, d.migSpec, d.migReconciled = m, spec, false
	if err := d.writeMIGSpecLocked(); err != nil {
		d.o.Log.Error("MIG: restoring the CDI spec of the instances claims created", "err", err)
	}
}

// hasMIG says whether any of the claim's devices is a MIG instance it
// creates.
func (p preparedClaim) hasMIG() bool {
	return slices.ContainsFunc(p.Devices, func(dv preparedDevice) bool { return dv.MIG != nil })
}

// foreignLocked are the GPU instances on partitioned GPUs that no claim
// in the checkpoint made or was making.
func (d *Driver) foreignLocked(uuid string, instances []nvml.GPUInstance) []nvml.GPUInstance {
	var out []nvml.GPUInstance
	for _, gi := range instances {
		ours := false
		for _, c := range d.cp.Claims {
			for _, dv := range c.Devices {
				m := dv.MIG
				if m != nil && m.GPU == uuid && (m.UUID != "" && m.GPUInstance == gi.ID || m.UUID == "" && m.Start == gi.Start && m.ProfileID == gi.ProfileID) {
					ours = true
				}
			}
		}
		if !ours {
			out = append(out, gi)
		}
	}
	return out
}

// heldInstanceLocked is the CDI device IDs of the instance a prepared
// claim made at placement device: what an admin-access request for the
// placement is given.
func (d *Driver) heldInstanceLocked(device string) ([]string, error) {
	for _, c := range d.cp.Claims {
		for _, dv := range c.Devices {
			if dv.Device == device && dv.MIG != nil && dv.MIG.UUID != "" && !dv.AdminAccess {
				return slices.Clone(dv.CDIDeviceIDs), nil
			}
		}
	}
	return nil, fmt.Errorf("device %s is a MIG placement with no instance a claim made: admin access watches an instance, and creates none; ask for it once a workload's claim holds the placement", device)
}

// migConflictLocked says why placement p of device on GPU uuid cannot be
// prepared: a prepared claim's instance, or an earlier device of the
// same claim, covers one of its slices. The scheduler's counters keep
// this from happening; a stale allocation must not reach NVML as a
// confusing failure.
func (d *Driver) migConflictLocked(uuid string, p nvml.MIGPlacement, same []preparedDevice) error {
	check := func(claim string, dv preparedDevice) error {
		if m := dv.MIG; m != nil && m.GPU == uuid && p.Overlaps(m.Start, m.Size) {
			return fmt.Errorf("MIG placement %s at slice %d overlaps device %s (%s at slice %d) of claim %s", p.Profile, p.Start, dv.Device, m.Profile, m.Start, claim)
		}
		return nil
	}
	for _, c := range d.cp.Claims {
		for _, dv := range c.Devices {
			if err := check(c.Namespace+"/"+c.Name, dv); err != nil {
				return err
			}
		}
	}
	for _, dv := range same {
		if err := check("being prepared", dv); err != nil {
			return err
		}
	}
	return nil
}

// createMIGLocked creates the instances of claim p's devices that do not
// exist (all of them for a new claim; after a reboot, those gone), and
// hands each device its instance's CDI device. On failure the instances
// this call created are destroyed again; the error wraps errLeftBehind
// when one of them (or a half-made one) could not be.
func (d *Driver) createMIGLocked(p *preparedClaim) error {
	var made []*preparedMIG
	fail := func(err error) error {
		for _, m := range made {
			if derr := d.mig.Destroy(d.parents[m.GPU], m.GPUInstance); derr != nil {
				err = fmt.Errorf("%w; destroying %s again: %w (%w)", err, m.UUID, derr, errLeftBehind)
			}
			m.UUID = ""
		}
		return err
	}
	for i := range p.Devices {
		dv := &p.Devices[i]
		m := dv.MIG
		if m == nil {
			continue
		}
		g, ok := d.parents[m.GPU]
		if !ok {
			return fail(fmt.Errorf("device %s: GPU %s is not partitioned on this node now", dv.Device, m.GPU))
		}
		if m.UUID != "" {
			got, found, err := d.mig.Find(g, m.GPUInstance)
			switch {
			case err != nil:
				return fail(fmt.Errorf("device %s: %w", dv.Device, err))
			case found && got.UUID == m.UUID:
				continue
			case found:
				return fail(fmt.Errorf("device %s: GPU instance %d of GPU %s is %s now, not the claim's %s; destroy it, or delete the pod", dv.Device, m.GPUInstance, m.GPU, got.UUID, m.UUID))
			}
			d.o.Log.Warn("MIG: a claim's instance is gone (the node rebooted, or it was destroyed by hand); creating it again", "device", dv.Device, "gpu", m.GPU, "mig", m.UUID)
		}
		dev, err := d.mig.Create(g, m.placement())
		if err != nil {
			if errors.Is(err, nvml.ErrLeftBehind) {
				err = fmt.Errorf("%w (%w)", err, errLeftBehind)
			}
			return fail(fmt.Errorf("device %s: %w", dv.Device, err))
		}
		m.created(dev)
		made = append(made, m)
		dv.CDIDeviceIDs = append(withoutKind(dv.CDIDeviceIDs, cdi.MIGKind), cdi.QualifiedName(cdi.MIGKind, dev.UUID))
	}
	return nil
}

// errLeftBehind marks a failed creation that may have left an instance:
// the claim stays recorded as being prepared, so the reconciliation
// destroys it by its placement.
var errLeftBehind = errors.New("an instance may be left; it is destroyed at the next call")

// withoutKind is ids without those of kind.
func withoutKind(ids []string, kind string) []string {
	prefix := kind + "="
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return len(id) > len(prefix) && id[:len(prefix)] == prefix })
}

// destroyMIGLocked destroys the instances of claim p; an instance whose
// GPU instance now holds another MIG device (a reboot, then someone else's)
// is left alone.
func (d *Driver) destroyMIGLocked(p preparedClaim) error {
	for _, dv := range p.Devices {
		m := dv.MIG
		if m == nil {
			continue
		}
		g, ok := d.parents[m.GPU]
		if !ok {
			d.o.Log.Warn("MIG: the GPU of a claim's instance is not partitioned now; its instance is left", "device", dv.Device, "gpu", m.GPU, "mig", m.UUID)
			continue
		}
		if m.UUID == "" {
			if err := d.destroyPendingLocked(g, m); err != nil {
				return fmt.Errorf("device %s: %w", dv.Device, err)
			}
			continue
		}
		got, found, err := d.mig.Find(g, m.GPUInstance)
		switch {
		case err != nil:
			return fmt.Errorf("device %s: %w", dv.Device, err)
		case !found:
			continue
		case got.UUID != m.UUID:
			d.o.Log.Warn("MIG: a claim's GPU instance holds another MIG device now; it is left", "device", dv.Device, "gpu", m.GPU, "gpuInstance", m.GPUInstance, "mig", got.UUID, "claimed", m.UUID)
			continue
		}
		if err := d.mig.Destroy(g, m.GPUInstance); err != nil {
			return fmt.Errorf("device %s: %w", dv.Device, err)
		}
	}
	return nil
}

// destroyPendingLocked destroys the GPU instance at pending entry m's
// placement, if one of its profile is there.
func (d *Driver) destroyPendingLocked(g nvml.GPU, m *preparedMIG) error {
	gis, err := d.mig.Instances(g)
	if err != nil {
		return err
	}
	for _, gi := range gis {
		if gi.Start == m.Start && gi.ProfileID == m.ProfileID {
			return d.mig.Destroy(g, gi.ID)
		}
	}
	return nil
}

// reconcileMIGLocked, once after start, destroys what the claims whose
// instance creation was under way when a process stopped created, and
// forgets those claims: none was reported prepared, and the kubelet
// prepares them again.
func (d *Driver) reconcileMIGLocked() {
	if d.mig == nil || d.migReconciled {
		return
	}
	d.migReconciled = true
	var dropped []types.UID
	for _, uid := range slices.Sorted(maps.Keys(d.cp.Claims)) {
		c := d.cp.Claims[uid]
		pending := slices.ContainsFunc(c.Devices, func(dv preparedDevice) bool { return dv.MIG != nil && dv.MIG.UUID == "" })
		if !pending {
			continue
		}
		for i := range c.Devices {
			if m := c.Devices[i].MIG; m != nil {
				// Its UUID on disk may be from before a retry: the
				// placement is what was being created.
				m.UUID = ""
			}
		}
		if err := d.destroyMIGLocked(c); err != nil {
			d.o.Log.Error("MIG: destroying the instance of a claim whose preparation was interrupted; retried at the next call", "claim", c.Namespace+"/"+c.Name, "err", err)
			d.migReconciled = false
			continue
		}
		d.o.Log.Info("MIG: destroyed what an interrupted Prepare created; the kubelet prepares the claim again", "claim", c.Namespace+"/"+c.Name)
		delete(d.cp.Claims, uid)
		dropped = append(dropped, uid)
	}
	if len(dropped) == 0 {
		return
	}
	if err := d.cp.save(d.o.CheckpointPath); err != nil {
		d.o.Log.Error("MIG: saving the checkpoint after reconciling", "err", err)
	}
	if err := d.writeMIGSpecLocked(); err != nil {
		d.o.Log.Error("MIG: CDI spec", "err", err)
	}
}

// writeMIGSpecLocked writes the spec of the instances the claims in the
// checkpoint hold.
func (d *Driver) writeMIGSpecLocked() error {
	if d.migSpec == nil {
		return nil
	}
	var devs []cdi.Device
	add := func(c preparedClaim) {
		for _, dv := range c.Devices {
			if m := dv.MIG; m != nil && m.UUID != "" {
				if dev, ok := cdi.MIGCaps(d.o.DevRoot, m.device()); ok {
					devs = append(devs, dev)
				}
			}
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(d.cp.Claims)) {
		add(d.cp.Claims[uid])
	}
	if err := d.migSpec(devs); err != nil {
		return fmt.Errorf("MIG CDI spec: %w", err)
	}
	return nil
}

// prepareMIGLocked creates the instances of new claim p (uid): recorded
// in the checkpoint first, so a crash during the creation leaves an entry
// that says what to destroy, then created, then their spec written.
func (d *Driver) prepareMIGLocked(uid types.UID, p *preparedClaim) error {
	start := d.o.Now()
	d.cp.Claims[uid] = *p
	if err := d.cp.save(d.o.CheckpointPath); err != nil {
		delete(d.cp.Claims, uid)
		return err
	}
	forget := func() {
		delete(d.cp.Claims, uid)
		if err := d.cp.save(d.o.CheckpointPath); err != nil {
			// The entry on disk has no instance: the next start forgets it.
			d.o.Log.Warn("MIG: forgetting a claim whose instances could not be made", "err", err)
		}
	}
	if err := d.createMIGLocked(p); err != nil {
		if errors.Is(err, errLeftBehind) {
			// Still recorded as being prepared (on disk it always was):
			// the next call's reconciliation destroys what is at its
			// placements, then forgets it, and the kubelet's retry
			// prepares it anew. NVML shut down under a creation (the
			// process stopping) ends here too.
			for _, dv := range p.Devices {
				if dv.MIG != nil {
					dv.MIG.UUID = ""
				}
			}
			d.cp.Claims[uid] = *p
			d.migReconciled = false
			return err
		}
		forget()
		return err
	}
	d.cp.Claims[uid] = *p
	if err := d.writeMIGSpecLocked(); err != nil {
		d.undoMIGLocked(*p)
		forget()
		return err
	}
	for _, dv := range p.Devices {
		if m := dv.MIG; m != nil {
			d.o.Log.Info("MIG: created an instance for a claim", "claim", p.Namespace+"/"+p.Name, "device", dv.Device, "gpu", m.GPU,
				"profile", m.Profile, "start", m.Start, "gpuInstance", m.GPUInstance, "computeInstance", m.ComputeInstance, "mig", m.UUID,
				"took", d.o.Now().Sub(start).String())
		}
	}
	return nil
}

// ensureMIGLocked makes again the instances of prepared claim p that are
// gone, and rewrites their spec when it did.
func (d *Driver) ensureMIGLocked(p *preparedClaim) error {
	if d.mig == nil {
		return errors.New("its MIG instances cannot be checked yet (the GPUs are not discovered yet); the kubelet retries")
	}
	before := p.migUUIDs()
	if err := d.createMIGLocked(p); err != nil {
		return err
	}
	if slices.Equal(before, p.migUUIDs()) {
		return nil
	}
	return d.writeMIGSpecLocked()
}

func (p preparedClaim) migUUIDs() []string {
	var out []string
	for _, dv := range p.Devices {
		if dv.MIG != nil {
			out = append(out, dv.MIG.UUID)
		}
	}
	return out
}

// unprepareMIGLocked destroys the instances of claim p.
func (d *Driver) unprepareMIGLocked(p preparedClaim) error {
	if d.mig == nil {
		return errors.New("its MIG instances cannot be destroyed yet (the GPUs are not discovered yet); the kubelet retries")
	}
	start := d.o.Now()
	if err := d.destroyMIGLocked(p); err != nil {
		return err
	}
	d.o.Log.Info("MIG: destroyed a claim's instances", "claim", p.Namespace+"/"+p.Name, "migs", p.migUUIDs(), "took", d.o.Now().Sub(start).String())
	return nil
}

// undoMIGLocked destroys what Prepare created for claim p, which is not
// reported prepared after all; failures are logged (the entry left on
// disk has no instance, and a restart clears what remains). The caller
// rewrites the spec once p is forgotten.
func (d *Driver) undoMIGLocked(p preparedClaim) bool {
	if d.mig == nil || !p.hasMIG() {
		return false
	}
	if err := d.destroyMIGLocked(p); err != nil {
		d.o.Log.Error("MIG: destroying the instances of a claim not prepared after all", "claim", p.Namespace+"/"+p.Name, "err", err)
	}
	return true
}
