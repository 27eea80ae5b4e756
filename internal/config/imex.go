package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// IMEX is the imex section: the IMEX channels of multi-node NVLink
// (GB200 and GB300 NVL72) that device-plugin mode gives every container
// with a GPU, as NVIDIA's device plugin does with its imex block
// (docs/multi-node-nvlink.md). Each key is a setting of its own
// (imex.channelIDs, --imex-channel-ids).
type IMEX struct {
	// ChannelIDs are the channels to inject: none, or channel 0.
	ChannelIDs []int `json:"channelIDs"`
	// Required makes a channel that cannot be made or found an error at
	// start (no GPU is served); else it is warned about and not injected.
	Required bool `json:"required"`
	// ComputeDomains (DRA mode) publishes this node's IMEX channel device
	// and serves ComputeDomain channel claims: the node's entry in the
	// domain's status, its nvidia-imex, the channel
	// (docs/compute-domains.md).
	ComputeDomains bool `json:"computeDomains"`
	// NodeIP is the address this node's nvidia-imex serves its peers on,
	// written to the node's entry in the domains' status.
	NodeIP string `json:"nodeIP"`
}

// imexSettings are the imex section's keys.
func imexSettings() []Setting {
	m := func(c *Config) *IMEX { return &c.IMEX }
	return []Setting{
		{Key: "imex.channelIDs", Category: CategoryIMEX, Flag: "imex-channel-ids", Default: "", EmptyOff: true,
			Usage: "device-plugin mode: the IMEX channels every container given a GPU (whole, MIG or a share) gets, as /dev/nvidia-caps-imex-channels/channel<N> and NVIDIA_IMEX_CHANNELS; empty (the default) or 0, as NVIDIA's plugin allows; the node is made from the driver's nvidia-caps-imex-channels major in --proc-root's devices file when missing. DRA mode gives channels through ComputeDomains instead",
			set:   ints(func(c *Config) *[]int { return &m(c).ChannelIDs })},
		{Key: "imex.required", Category: CategoryIMEX, Flag: "imex-required", Default: "false",
			Usage: "true: a channel of imex.channelIDs that cannot be made or found (no IMEX support in the driver, a file in the way) stops the plugin at start with the reason, so no GPU is served without it; false: it is warned about once and not injected",
			set:   boolean(func(c *Config) *bool { return &m(c).Required })},
		{Key: "imex.computeDomains", Category: CategoryIMEX, Flag: "imex-compute-domains", Default: "false",
			Usage: "DRA mode: publish this node's IMEX channel device (when its GPUs completed their fabric registration) and serve ComputeDomain channel claims: the node's entry in the domain's status, one nvidia-imex per domain from --driver-root, the channel node and its CDI device; needs imex.nodeIP",
			set:   boolean(func(c *Config) *bool { return &m(c).ComputeDomains })},
		{Key: "imex.nodeIP", Category: CategoryIMEX, Flag: "imex-node-ip", Default: "",
			Usage: "DRA mode with imex.computeDomains: the address this node's nvidia-imex serves its ComputeDomain peers on, and that the node writes in the domain's status (the chart sets the pod's status.hostIP)",
			set:   str(func(c *Config) *string { return &m(c).NodeIP })},
	}
}

// ints is a comma-separated list of whole numbers; blank items are dropped.
func ints(field func(*Config) *[]int) setter {
	return func(c *Config, key, value string) error {
		var out []int
		for _, f := range strings.Split(value, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			n, err := strconv.Atoi(f)
			if err != nil {
				return fmt.Errorf("config: %s: %q is not a list of whole numbers (example: \"0\")", key, value)
			}
			out = append(out, n)
		}
		*field(c) = out
		return nil
	}
}

// validateIMEX checks the imex section: channel 0 or none, as NVIDIA's
// plugin allows (every container on the node gets the same channels, so
// only the default channel makes sense there), and device-plugin mode only.
func validateIMEX(c Config, field func(string) string) []error {
	var errs []error
	ids := c.IMEX.ChannelIDs
	if len(ids) > 1 || len(ids) == 1 && ids[0] != 0 {
		errs = append(errs, fmt.Errorf("config: %s: %v: only channel 0 or none can be given to every container (as NVIDIA's imex.channelIDs); set it to 0, or leave it empty", field("imex.channelIDs"), ids))
	}
	if len(ids) > 0 && c.KubeletAPI == KubeletAPIDRA {
		errs = append(errs, fmt.Errorf("config: %s: %v needs kubeletAPI %s; in DRA mode IMEX channels come with ComputeDomains: leave it empty", field("imex.channelIDs"), ids, KubeletAPIDevicePlugin))
	}
	if c.IMEX.ComputeDomains {
		if c.KubeletAPI != KubeletAPIDRA {
			errs = append(errs, fmt.Errorf("config: %s: true needs kubeletAPI %s; in device-plugin mode use imex.channelIDs, or set it to false", field("imex.computeDomains"), KubeletAPIDRA))
		}
		if net.ParseIP(c.IMEX.NodeIP) == nil {
			errs = append(errs, fmt.Errorf("config: %s: %q is not an IP address, and imex.computeDomains needs one; set it to the node's address (the chart sets the pod's status.hostIP), or set imex.computeDomains to false", field("imex.nodeIP"), c.IMEX.NodeIP))
		}
	}
	return errs
}
