// Package imexchan readies the IMEX channels device-plugin mode gives
// every container with a GPU (config imex.channelIDs): it makes their
// nodes under the host's /dev from the driver's major, and says which
// channels a container can be given. imex.required decides whether a
// channel that cannot be readied is an error or a warning, as NVIDIA's
// device plugin does. It serves no kubelet API and builds no answer: the
// GPU model injects what it returns.
package imexchan

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/imex"
)

// Options are the channels to ready and where.
type Options struct {
	// IDs are the channels every GPU container gets (imex.channelIDs).
	IDs []int
	// Required makes a channel that cannot be readied an error
	// (imex.required); else it is warned about and left out.
	Required bool
	// ProcRoot is the host's /proc, DevRoot its /dev.
	ProcRoot, DevRoot string
}

// Provide makes the node of each channel in o.IDs that lacks one and
// returns the channels whose nodes are in place, in o.IDs' order. With
// o.Required, the first channel that cannot be readied (the driver lists
// no IMEX major: it has no IMEX support; a file in the way) is an error
// naming the key and the fix; without it each is logged once as a warning
// and left out.
func Provide(o Options, log *slog.Logger) ([]int, error) {
	if len(o.IDs) == 0 {
		return nil, nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	skip := func(reason error) ([]int, error) {
		if o.Required {
			return nil, fmt.Errorf("imex.required is true but IMEX channels %v cannot be given to containers: %w; fix the driver (R550 or later, with IMEX support) or set imex.required to false to serve the GPUs without them", o.IDs, reason)
		}
		log.Warn("IMEX channels not injected (imex.required is false)", "channels", o.IDs, "reason", reason.Error())
		return nil, nil
	}
	major, err := driverMajor(o.ProcRoot)
	if err != nil {
		return skip(err)
	}
	var out []int
	for _, id := range o.IDs {
		path, err := imex.EnsureChannel(o.DevRoot, major, id)
		if err != nil {
			if o.Required {
				return nil, fmt.Errorf("imex.required is true but IMEX channel %d cannot be given to containers: %w; fix that or set imex.required to false", id, err)
			}
			log.Warn("IMEX channel not injected (imex.required is false)", "channel", id, "reason", err.Error())
			continue
		}
		log.Info("IMEX channel given to every GPU container", "channel", id, "path", path, "major", major)
		out = append(out, id)
	}
	return out, nil
}

// Channel is what Preview says of one channel of Options.IDs.
type Channel struct {
	ID int
	// Path is the node as a container sees it.
	Path string
	// Given: serve gives the channel to every GPU container. Present:
	// its node is already under DevRoot (else serve makes it).
	Given, Present bool
	// Reason is why it is not given, when not.
	Reason string
}

// Preview says, without making anything, what Provide would do with
// o.IDs: each channel is given when the driver lists the IMEX major and
// no file other than the channel's node is in its way. It is for the
// commands that show what serve would do.
func Preview(o Options) []Channel {
	if len(o.IDs) == 0 {
		return nil
	}
	out := make([]Channel, len(o.IDs))
	for k, id := range o.IDs {
		out[k] = Channel{ID: id, Path: imex.Path(id)}
	}
	fail := func(reason string) []Channel {
		for k := range out {
			out[k].Reason = reason
		}
		return out
	}
	major, err := driverMajor(o.ProcRoot)
	if err != nil {
		return fail(err.Error())
	}
	for k, id := range o.IDs {
		present, err := imex.IsChannel(o.DevRoot, major, id)
		if err != nil {
			out[k].Reason = err.Error()
			continue
		}
		out[k].Given, out[k].Present = true, present
	}
	return out
}

// driverMajor is the IMEX channels' major from procRoot/devices; none
// listed is an error saying the driver has no IMEX support.
func driverMajor(procRoot string) (uint32, error) {
	major, ok, err := imex.Major(procRoot)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("%s lists no %s character device: the driver has no IMEX support", filepath.Join(procRoot, "devices"), imex.DeviceName)
	}
	return major, nil
}
