package dra

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// checkConfig refuses opaque configuration meant for this driver: it takes
// none yet, and a setting silently ignored is worse than a pod that does
// not start and says why. Configuration for other drivers is theirs.
func checkConfig(driver string, cfgs []resourceapi.DeviceAllocationConfiguration) error {
	for _, c := range cfgs {
		if c.Opaque == nil || c.Opaque.Driver != driver {
			continue
		}
		reqs := "all requests"
		if len(c.Requests) > 0 {
			reqs = "requests " + strings.Join(c.Requests, ", ")
		}
		return fmt.Errorf("opaque configuration for driver %s (from the %s, for %s): this driver takes no opaque parameters; remove the config entry with driver %q", driver, strings.ToLower(string(c.Source)), reqs, driver)
	}
	return nil
}
