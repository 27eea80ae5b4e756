package remediate

import (
	"context"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/podresources"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
)

// pollUsage tells the Machine who uses each GPU of the node now (a reset
// of GPUs together needs every GPU idle), leaving out a GPU whose usage
// cannot be told: unknown is never idle.
func (s *Service) pollUsage(ctx context.Context) {
	var all podresources.Holders
	holdersErr := "who holds it cannot be known without the kubelet's PodResources API (podResourcesSocket)"
	if s.o.Holders != nil {
		var err error
		if all, err = s.o.Holders(ctx); err == nil {
			holdersErr = ""
		} else {
			holdersErr = "pods: " + err.Error()
			s.log.Warn("remediation: cannot tell which pods hold the GPUs; a withheld GPU waits", "err", err)
		}
	}
	var cmds []remedy.Command
	for _, st := range s.m.Status() {
		if st.Absent {
			continue
		}
		g := s.byUUID[st.GPU]
		if holdersErr != "" {
			s.usageErr[g.UUID] = holdersErr
			continue
		}
		procs, err := s.processes(g.UUID)
		if err != nil {
			s.usageErr[g.UUID] = "processes: " + err.Error()
			continue
		}
		delete(s.usageErr, g.UUID)
		u := remedy.Usage{Holders: len(s.holders(all, g)), Processes: procs}
		if s.o.MPS != nil {
			u.MPSRunning = s.o.MPS.Running(g.UUID)
		}
		cmds = append(cmds, s.m.Usage(g.UUID, u, s.o.Clock.Now())...)
	}
	s.handle(ctx, cmds)
	s.syncGate()
}

func (s *Service) processes(uuid string) (int, error) {
	if s.o.Resetter == nil {
		return 0, ErrUnavailable
	}
	return s.o.Resetter.Processes(uuid)
}

// holders are the containers holding g or any unit of it, through the
// device-plugin API or a DRA claim, each once.
func (s *Service) holders(all podresources.Holders, g GPU) []podresources.Holder {
	var lists [][]podresources.Holder
	for _, n := range g.Names {
		lists = append(lists, all.Of(n))
	}
	if g.DRADevice != "" {
		lists = append(lists, all.DRADevicesWhere(s.o.Driver, s.o.Pool, func(device string) bool {
			return device == g.DRADevice || strings.HasPrefix(device, g.DRADevice+"-")
		}))
	}
	return podresources.Merge(lists...)
}
