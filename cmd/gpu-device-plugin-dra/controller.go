package main

import (
	"fmt"
	"os"
	"syscall"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon/handoff"
)

// controllerCommand is how charts of earlier releases ran the ComputeDomain
// controller, as a command of this program. The controller is
// gpu-device-plugin-controller now, so that this daemon links no
// informers or leader election; the command stays for the Deployment
// those charts leave running during an upgrade.
const controllerCommand = "compute-domain-controller"

// execController replaces this process with gpu-device-plugin-controller
// from this executable's directory, with args, keeping the PID so that the
// pod's signals reach the controller. It returns only on failure.
func execController(args []string) error {
	path, err := handoff.Find(handoff.Controller, false)
	if err != nil {
		return fmt.Errorf("%s: %w", controllerCommand, err)
	}
	err = syscall.Exec(path, append([]string{handoff.Controller}, args...), os.Environ())
	return fmt.Errorf("%s: starting %s: %w", controllerCommand, path, err)
}
