// Package ondisk keeps the plugin's CDI specs on disk: one file per
// resource, written when its devices change, retried until a failed write
// lands, kept in step with the control nodes in /dev and with the hook, and
// asked before a CDI name is handed out. Both front-ends use it.
package ondisk

// Options are the settings the specs on disk follow, copied from the
// configuration by the wiring (daemon.CDIOptions).
type Options struct {
	// SpecDir is where the plugin's spec files are written.
	SpecDir string
	// CDI says a device-list strategy hands out CDI names; without it
	// NewStore removes the plugin's spec files and makes no store.
	CDI bool
	// DRA says the DRA front-end serves: its MPS and MIG specs are kept
	// at start.
	DRA bool
	// NICResources are the NIC pools' names, each one spec's kind.
	NICResources []string
	// DriverRoot is where the driver's files are searched; HostDriverRoot,
	// when set, is where the host sees that root.
	DriverRoot, HostDriverRoot string
	// DevRoot is the host's /dev.
	DevRoot string
	// HookPath is the CDI hook the GPU spec runs; "" runs none.
	HookPath string
	// IMEXChannels are device-plugin mode's IMEX channels
	// (imex.channelIDs): the GPU spec defines a device for each, which
	// Allocate names only once the channel's node is ready.
	IMEXChannels []int
}
