package remediate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/remedy"
)

// Carrying out the Machine's commands: saved first, then each done, with
// resets and probes off Run's goroutine and their results fed back.

// handle saves the Machine's state, then carries out its commands.
func (s *Service) handle(ctx context.Context, cmds []remedy.Command) {
	if len(cmds) == 0 {
		return
	}
	s.save()
	s.carryOut(ctx, cmds)
}

func (s *Service) save() {
	if s.o.Store == nil {
		return
	}
	err := s.o.Store.Save(s.m.Save())
	switch {
	case err != nil && !s.saveFailed:
		s.log.Warn("saving the remediation; a restarted plugin would not know it (a GPU being reset may be reset again)", "err", err)
	case err == nil && s.saveFailed:
		s.log.Info("saving the remediation works again")
	}
	s.saveFailed = err != nil
}

func (s *Service) carryOut(ctx context.Context, cmds []remedy.Command) {
	withheld := false
	for _, c := range cmds {
		s.do(ctx, c)
		withheld = withheld || c.Kind == remedy.CmdWithhold
	}
	s.syncGate()
	s.syncReboot()
	s.syncCordon()
	if withheld && s.waiting() {
		// At once: the Machine waits for a report made since it withheld.
		s.pollUsage(ctx)
	}
}

func (s *Service) do(ctx context.Context, c remedy.Command) {
	log := s.log.With("gpu", c.GPU)
	switch c.Kind {
	case remedy.CmdWithhold:
		log.Warn("withholding the GPU for its remediation", "reason", c.Reason)
		s.event(c.GPU, EventWithheld, "withheld until it is remediated: "+c.Reason)
	case remedy.CmdEvict:
		if s.o.Evicter == nil {
			log.Info("eviction asked, but this front-end evicts nothing; waiting for the GPU's pods to end", "reason", c.Reason)
			return
		}
		log.Warn("evicting the pods holding the GPU (its device taint is NoExecute)", "reason", c.Reason)
		s.o.Evicter.Evict(c.GPU, true)
	case remedy.CmdStopMPS:
		if s.o.MPS == nil {
			return
		}
		if err := s.o.MPS.Stop(ctx, c.GPU); err != nil {
			log.Warn("stopping the GPU's MPS control daemon", "err", err)
		}
	case remedy.CmdReset:
		log.Warn("resetting", "gpus", c.GPUs, "reason", c.Reason)
		for _, id := range c.GPUs {
			s.event(id, EventResetStarted, fmt.Sprintf("resetting %v: %s", c.GPUs, c.Reason))
		}
		gpus := slices.Clone(c.GPUs)
		s.wg.Go(func() {
			err := s.reset(ctx, gpus)
			s.metric(func(r Recorder) {
				if err != nil {
					r.Reset(ResultFailure)
				} else {
					r.Reset(ResultSuccess)
				}
			})
			s.deliver(ctx, result{gpu: c.GPU, err: err})
		})
	case remedy.CmdProbe:
		log.Info("probing before the GPU is given back")
		s.wg.Go(func() { s.deliver(ctx, result{gpu: c.GPU, probe: true, err: s.probe(ctx, c.GPU)}) })
	case remedy.CmdGiveBack:
		log.Info("giving the GPU back", "took", c.Took.String(), "reason", c.Reason)
		if s.o.Evicter != nil {
			s.o.Evicter.Evict(c.GPU, false)
		}
		if s.o.MPS != nil {
			s.o.MPS.Start(c.GPU)
		}
		if s.health != nil {
			s.health.ClearSticky(c.GPU)
		}
		delete(s.usageErr, c.GPU)
		s.metric(func(r Recorder) { r.Recovered(c.Took) })
		s.event(c.GPU, EventGivenBack, fmt.Sprintf("given back after %s: %s", c.Took.Round(time.Second), c.Reason))
	case remedy.CmdNeedsHuman:
		log.Error("the GPU stays out until a human acts", "reason", c.Reason)
		s.event(c.GPU, EventNeedsHuman, "out until a human acts: "+c.Reason)
	case remedy.CmdNodeReboot:
		log.Error("the node needs a reboot", "reason", c.Reason)
		s.event(c.GPU, EventNeedsReboot, "the node needs a reboot: "+c.Reason)
	case remedy.CmdCordon:
		if s.o.Cordoner == nil {
			if !s.cordonSaid {
				s.cordonSaid = true
				log.Warn("remediation.cordon asks for the node to be cordoned, but the plugin has no API access to do it (logged once)", "reason", c.Reason)
			}
			return
		}
		s.cordonFor[c.GPU] = c.Reason
	case remedy.CmdTransition:
		log.Info("remediation", "from", string(c.From), "to", string(c.To), "reason", c.Reason)
		s.record(c.GPU, c.To)
	case remedy.CmdNote:
		log.Info("remediation: " + c.Reason)
	default:
		log.Warn("remediation command of a kind this service does not know", "kind", string(c.Kind), "reason", c.Reason)
	}
}

// reset resets gpus; Reset's error, or none.
func (s *Service) reset(ctx context.Context, gpus []string) error {
	if s.o.Resetter == nil {
		return ErrUnavailable
	}
	return s.o.Resetter.Reset(ctx, gpus)
}

// probe checks that gpu reads clean, then runs the probe.
func (s *Service) probe(ctx context.Context, gpu string) error {
	if s.o.Resetter == nil || s.o.Prober == nil {
		return ErrUnavailable
	}
	if err := s.o.Resetter.Verify(gpu); err != nil {
		return fmt.Errorf("NVML does not read it clean: %w", err)
	}
	return s.o.Prober.Probe(ctx, gpu)
}

// ErrUnavailable is the result of a reset or probe with nothing to do it.
var ErrUnavailable = errors.New("not available: no resetter or prober was given")

func (s *Service) deliver(ctx context.Context, r result) {
	select {
	case s.results <- r:
	case <-ctx.Done():
	}
}

func (s *Service) event(gpu, reason, msg string) {
	if s.o.Reporter != nil {
		s.o.Reporter.Event(gpu, reason, msg)
	}
}

func (s *Service) metric(f func(Recorder)) {
	if s.o.Metrics != nil {
		f(s.o.Metrics)
	}
}

func (s *Service) record(gpu string, st remedy.State) {
	if s.states[gpu] == st {
		return
	}
	s.states[gpu] = st
	s.metric(func(r Recorder) { r.State(gpu, string(st)) })
}

// syncGate withholds each GPU the Machine withholds, with its state and
// reason, and lets the others' health pass.
func (s *Service) syncGate() {
	for _, st := range s.m.Status() {
		if !st.State.IsWithheld() {
			s.gate.release(st.GPU)
			continue
		}
		reason := ReasonPrefix + string(st.State) + ": " + st.Reason
		if e := s.usageErr[st.GPU]; e != "" && (st.State == remedy.StateDraining || st.State == remedy.StateWaitingIdle) {
			reason += " (its usage is not known: " + e + ")"
		}
		s.gate.withhold(st.GPU, reason)
	}
}

// syncReboot keeps the node's reboot condition in step with the GPUs.
func (s *Service) syncReboot() {
	var why []string
	for _, st := range s.m.Status() {
		if st.State == remedy.StateNeedsReboot {
			why = append(why, st.GPU+": "+st.Reason)
		}
	}
	reason := ""
	if len(why) > 0 {
		reason = fmt.Sprint(len(why), " GPU(s) need a node reboot: ", why[0])
		if len(why) > 1 {
			reason += fmt.Sprintf(" (and %d more)", len(why)-1)
		}
	}
	if reason == s.reboot {
		return
	}
	s.reboot = reason
	if s.o.Reporter != nil {
		s.o.Reporter.NodeReboot(reason, reason != "")
	}
}

// syncCordon keeps the Node cordoned while a GPU the Machine asked a
// cordon for still needs a reboot, and asks for the cordon lifted once
// none does (a human's release, a new boot). The Cordoner is told only of
// changes, and once at the start.
func (s *Service) syncCordon() {
	if s.o.Cordoner == nil {
		return
	}
	why := ""
	still := map[string]string{}
	for _, st := range s.m.Status() {
		if r, asked := s.cordonFor[st.GPU]; asked && st.State == remedy.StateNeedsReboot {
			still[st.GPU] = r
			if why == "" {
				why = st.GPU + ": " + r
			}
		}
	}
	s.cordonFor = still
	on := len(s.cordonFor) > 0
	if s.cordonTold && on == s.cordoned {
		return
	}
	s.cordonTold, s.cordoned = true, on
	if on {
		s.log.Warn("asking for the node to be cordoned until it is rebooted", "reason", why)
	} else {
		s.log.Info("no GPU needs a node reboot: asking for a cordon of the plugin's own to be lifted, if there is one")
	}
	s.o.Cordoner.Cordon(why, on)
}

// waiting says whether any GPU waits for its users to go.
func (s *Service) waiting() bool {
	for _, st := range s.m.Status() {
		if st.State == remedy.StateDraining || st.State == remedy.StateWaitingIdle {
			return true
		}
	}
	return false
}
