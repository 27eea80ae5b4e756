package dpnode

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/sysfs"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi/ondisk"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/nic"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/node/devinfo"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin"
)

var (
	_ deviceplugin.Backend            = nicBackend{}
	_ deviceplugin.PreferredAllocator = nicBackend{}
)

// nicBackend is a pool as its server's backend: the pool's answer, plus
// the device-information file of each allocated NIC, which Multus reads
// when it creates the pod's sandbox, after Allocate.
type nicBackend struct {
	pool  *nic.Pool
	specs *ondisk.Store
	info  *devinfo.Locked
}

// Allocate fails when a file cannot be written: a pod whose secondary
// network would come up without its device information is worse than one
// the kubelet retries.
func (b nicBackend) Allocate(ids []string) (*device.Answer, error) {
	// No CDI name nothing defines (read-only or full spec dir).
	if err := b.specs.Unwritten(b.pool.Resource()); err != nil {
		return nil, err
	}
	resp, err := b.pool.Allocate(ids)
	if err != nil {
		return nil, err
	}
	err = b.info.With(func(info devinfo.Dir) error {
		nics := b.pool.NICs()
		for _, id := range ids {
			i, found := slices.BinarySearchFunc(nics, id, func(n sysfs.NIC, id string) int { return cmp.Compare(n.Address, id) })
			if !found {
				return fmt.Errorf("%w %q in %s", nic.ErrUnknownNIC, id, b.pool.Resource())
			}
			if _, err := info.Write(b.pool.Resource(), nics[i]); err != nil {
				return fmt.Errorf("device information for CNI plugins of %s in %s: %w", id, b.pool.Resource(), err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (b nicBackend) Preferred(available, mustInclude []string, size int) ([]string, error) {
	return b.pool.Preferred(available, mustInclude, size)
}
