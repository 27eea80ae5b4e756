package ondisk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/cdi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

// Retry bounds of a spec write that failed (read-only, full or missing
// spec directory).
const (
	specRetryMin = 500 * time.Millisecond
	specRetryMax = 30 * time.Second
)

// staticSpecDir is where runtimes read hand-made and packaged specs, such
// as the NVIDIA Container Toolkit's, besides cdiSpecDir.
const staticSpecDir = "/etc/cdi"

// Store owns the plugin's CDI spec files: one per resource, rewritten
// when that resource's devices change. Files outlive the plugin: the
// kubelet restarts a container with the CDI names of the Allocate answer it
// checkpointed, without asking again, so a spec removed on shutdown would
// keep every GPU container from restarting while the plugin is down. A
// write that fails is retried with backoff until it lands; until then
// ready reports the error, so no name nothing defines is handed out. The
// GPU and NIC goroutines both publish, so writes are serialised here.
type Store struct {
	writer cdi.Writer
	log    *slog.Logger
	poke   chan struct{}
	// retryMin and retryMax bound the wait between retries.
	retryMin, retryMax time.Duration
	// retried, when set (tests), gets each retry round's outcome.
	retried func(failed int)

	mu      sync.Mutex
	wanted  map[string]*specs.Spec // resource -> spec to be on disk
	failed  map[string]error       // resource -> last write error
	tries   map[string]int         // resource -> failed writes in a row
	written map[string]string      // resource -> file
}

// NewStore removes this plugin's spec files of kinds it no longer
// serves (all of them when no strategy needs CDI: nil is returned then)
// and warns about other specs that define our GPU kind.
func NewStore(o Options, log *slog.Logger) (*Store, error) {
	w := cdi.Writer{Dir: o.SpecDir, Owner: cdi.DefaultOwner}
	if !o.CDI {
		if err := w.RemoveAll(); err != nil {
			log.Warn("removing CDI specs left by an earlier cdi-* configuration", "dir", o.SpecDir, "err", err)
		}
		return nil, nil
	}
	keep := []string{cdi.GPUKind}
	if o.DRA {
		// Rewritten by the DRA driver once the GPUs are up; until then
		// the containers of prepared MPS claims, and of MIG instances
		// claims created, still restart.
		keep = append(keep, cdi.MPSKind, cdi.MIGKind)
	}
	keep = append(keep, o.NICResources...)
	var files []string
	for _, kind := range keep {
		p, err := w.Path(kind)
		if err != nil {
			return nil, fmt.Errorf("CDI spec file of %s: %w", kind, err)
		}
		files = append(files, p)
	}
	if err := w.RemoveStale(files); err != nil {
		log.Warn("removing CDI specs of kinds no longer served", "dir", o.SpecDir, "err", err)
	}
	dirs := []string{o.SpecDir}
	if o.SpecDir != staticSpecDir {
		dirs = append(dirs, staticSpecDir)
	}
	for _, f := range w.Conflicts(cdi.GPUKind, dirs...) {
		log.Warn("another CDI spec defines our GPU kind; the runtime's CDI cache will drop the names both define and GPU containers will fail to start: remove that file",
			"kind", cdi.GPUKind, "file", f)
	}
	return &Store{
		writer:   w,
		log:      log,
		poke:     make(chan struct{}, 1),
		retryMin: specRetryMin,
		retryMax: specRetryMax,
		wanted:   map[string]*specs.Spec{},
		failed:   map[string]error{},
		tries:    map[string]int{},
		written:  map[string]string{},
	}, nil
}

// Publish writes resource's spec at once, or removes its file when spec
// is nil. A failed write is logged, kept for ready, and retried by run.
func (s *Store) Publish(resource string, spec *specs.Spec) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if spec == nil {
		delete(s.wanted, resource)
		delete(s.failed, resource)
		delete(s.tries, resource)
		if p, ok := s.written[resource]; ok {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				s.log.Warn("removing CDI spec", "resource", resource, "path", p, "err", err)
			}
			delete(s.written, resource)
		}
		return
	}
	s.wanted[resource] = spec
	s.tries[resource] = 0
	s.writeLocked(resource)
}

func (s *Store) writeLocked(resource string) {
	spec := s.wanted[resource]
	p, err := s.writer.Write(spec)
	if err != nil {
		s.tries[resource]++
		if _, known := s.failed[resource]; !known {
			s.log.Error("writing CDI spec failed; its devices are not handed out until it is written, retrying",
				"resource", resource, "kind", spec.Kind, "err", err)
		} else {
			s.log.Debug("writing CDI spec failed again", "resource", resource, "err", err, "attempt", s.tries[resource])
		}
		s.failed[resource] = err
		select {
		case s.poke <- struct{}{}:
		default:
		}
		return
	}
	if _, was := s.failed[resource]; was {
		s.log.Info("wrote CDI spec after failures", "resource", resource, "path", p, "attempts", s.tries[resource]+1)
	} else if s.written[resource] != p {
		s.log.Info("wrote CDI spec", "resource", resource, "path", p, "devices", len(spec.Devices))
	}
	delete(s.failed, resource)
	s.tries[resource] = 0
	s.written[resource] = p
}

// ready is nil when resource's current spec is on disk, else why not.
func (s *Store) Ready(resource string) error {
	if err := s.Unwritten(resource); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.wanted[resource]; !ok {
		return fmt.Errorf("%w: no CDI spec of %s yet", device.ErrNotReady, resource)
	}
	return nil
}

// Unwritten is an error when resource's spec is wanted but its last write
// failed; a resource with no spec at all (NICs without device nodes) is
// not its business. Nil on a nil store.
func (s *Store) Unwritten(resource string) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err, ok := s.failed[resource]; ok {
		return fmt.Errorf("%w: the CDI spec of %s is not written yet: %w", device.ErrNotReady, resource, err)
	}
	return nil
}

// Run retries failed writes, waiting specRetryMin doubling to
// specRetryMax between rounds, until ctx ends.
func (s *Store) Run(ctx context.Context) {
	if s == nil {
		return
	}
	wait := s.retryMin
	for {
		s.mu.Lock()
		pending := len(s.failed) > 0
		s.mu.Unlock()
		if !pending {
			wait = s.retryMin
			select {
			case <-ctx.Done():
				return
			case <-s.poke:
				continue
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, s.retryMax)
		s.mu.Lock()
		for resource := range s.failed {
			s.writeLocked(resource)
		}
		failed := len(s.failed)
		s.mu.Unlock()
		if s.retried != nil {
			s.retried(failed)
		}
		// Drain the pokes this round's own failures sent.
		select {
		case <-s.poke:
		default:
		}
	}
}
