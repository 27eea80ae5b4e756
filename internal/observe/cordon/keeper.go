package cordon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/observe/backoff"
)

// The Events a Keeper reports on the Node.
const (
	EventCordoned   = "NodeCordoned"
	EventUncordoned = "NodeUncordoned"
)

// Events tells of a cordon made or lifted; report.Reporter's NodeEvent is
// one.
type Events interface {
	NodeEvent(reason, message string, warning bool)
}

// Options configure a Keeper.
type Options struct {
	// Node is this node's name. Required.
	Node string
	// Events gets an Event on the Node for each cordon made or lifted;
	// nil: none.
	Events Events
	Log    *slog.Logger
	// Backoff spaces the retries after a failed call; zero is
	// backoff.Default.
	Backoff backoff.Policy
	// After is time.After; tests pass their own.
	After func(time.Duration) <-chan time.Time
}

// Keeper keeps the Node cordoned as asked, on its own goroutine (Run).
type Keeper struct {
	w   Writer
	o   Options
	log *slog.Logger

	wake chan struct{}

	mu sync.Mutex
	// seq counts the requests; a pass clears what it owed only when no
	// request came during it.
	seq uint64
	why string
	// onOwed: a cordon asked and not yet done; offOwed an uncordon. Both
	// when an uncordon and then a cordon came before Run got to them: the
	// uncordon goes first, so an annotation of ours left from before (the
	// Node uncordoned by hand) is gone and does not stop the new cordon.
	onOwed, offOwed bool

	// passed is called after each pass (tests).
	passed func()
}

// New builds a Keeper for api.
func New(api API, o Options) (*Keeper, error) {
	if api == nil {
		return nil, errors.New("cordon: no API client")
	}
	if o.Node == "" {
		return nil, errors.New("cordon: no node name")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.After == nil {
		o.After = time.After
	}
	return &Keeper{w: Writer{API: api, Node: o.Node}, o: o, log: o.Log.With("node", o.Node), wake: make(chan struct{}, 1)}, nil
}

// Cordon asks for the Node cordoned, saying why (on), or for our cordon
// lifted (off). It never blocks: Run does the calls, and retries them.
func (k *Keeper) Cordon(why string, on bool) {
	k.mu.Lock()
	k.seq++
	if on {
		k.onOwed, k.why = true, why
	} else {
		k.onOwed, k.offOwed = false, true
	}
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// Run does what was asked until ctx ends. After a failure it waits by the
// backoff policy (never less than the server's Retry-After), whatever is
// asked meanwhile, then does what is owed by then.
func (k *Keeper) Run(ctx context.Context) {
	b := backoff.New(k.o.Backoff)
	var retry <-chan time.Time
	for {
		if retry == nil {
			wait, failed := k.pass(ctx, b)
			if k.passed != nil {
				k.passed()
			}
			if failed {
				retry = k.o.After(wait)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-k.wake:
		case <-retry:
			retry = nil
		}
	}
}

// pass does what is owed: the uncordon first, then the cordon. It says how
// long to wait after a failure.
func (k *Keeper) pass(ctx context.Context, b *backoff.Backoff) (time.Duration, bool) {
	k.mu.Lock()
	seq, why, on, off := k.seq, k.why, k.onOwed, k.offOwed
	k.mu.Unlock()
	if off {
		out, err := k.w.Uncordon(ctx)
		if err != nil {
			return k.failed(ctx, b, "lifting the plugin's cordon of its Node", err)
		}
		k.uncordoned(out)
		// Done with: a retry of the cordon below must not undo a cordon
		// that was made though its answer was lost.
		k.paid(seq, &k.offOwed)
	}
	if on {
		out, err := k.w.Cordon(ctx, why)
		if err != nil {
			return k.failed(ctx, b, "cordoning the Node for a GPU that needs a node reboot", err)
		}
		k.cordoned(out, why)
		k.paid(seq, &k.onOwed)
	}
	b.Reset()
	return 0, false
}

// paid clears what a pass owed, unless a request came during it.
func (k *Keeper) paid(seq uint64, owed *bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.seq == seq {
		*owed = false
	}
}

func (k *Keeper) failed(ctx context.Context, b *backoff.Backoff, what string, err error) (time.Duration, bool) {
	wait, class := b.Fail(err)
	if ctx.Err() == nil {
		k.log.Warn(what+"; retrying (the GPU stays out either way)", "class", class.String(), "retryIn", wait.String(), "failures", b.Failures(), "err", err)
	}
	return wait, true
}

func (k *Keeper) cordoned(out Outcome, why string) {
	switch out {
	case Cordoned:
		k.log.Warn("cordoned the Node until it is rebooted: a GPU needs a node reboot", "reason", why, "annotation", Annotation)
		k.event(EventCordoned, "cordoned by gpu-device-plugin until the node is rebooted: "+why, true)
	case AlreadyOurs:
		k.log.Info("the Node is already cordoned by the plugin", "reason", why)
	case CordonedByOthers:
		k.log.Info("the Node is already cordoned, not by the plugin: left as it is, and the plugin will not uncordon it", "reason", why)
	case LiftedByOthers:
		k.log.Warn("someone uncordoned the plugin's cordon of the Node (its annotation is still there): not cordoning it again", "reason", why, "annotation", Annotation)
	}
}

func (k *Keeper) uncordoned(out Outcome) {
	switch out {
	case Uncordoned:
		k.log.Info("uncordoned the Node: no GPU needs a node reboot any more, and the cordon was the plugin's")
		k.event(EventUncordoned, "uncordoned by gpu-device-plugin: no GPU needs a node reboot any more (it lifts only its own cordon)", false)
	case LiftedByOthers:
		k.log.Info("the plugin's cordon was already lifted by someone; removed its annotation", "annotation", Annotation)
	case NotOurs:
		k.log.Debug("no cordon of the plugin's on the Node")
	}
}

func (k *Keeper) event(reason, msg string, warning bool) {
	if k.o.Events != nil {
		k.o.Events.NodeEvent(reason, msg, warning)
	}
}
