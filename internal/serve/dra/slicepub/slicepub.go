// Package slicepub publishes a node's ResourceSlices: it keeps the slices
// of one driver and node on the API server equal to what the driver wants,
// writing only the slices that differ.
//
// It follows the ResourceSlice controller of k8s.io/dynamic-resource-allocation,
// so slices written by either are taken over by the other without a
// rewrite: the same names (a hexadecimal index of at least 5 digits, the
// driver, the node, then the server's suffix), the same generation rule
// (a write of more than one slice bumps the pool's generation) and the
// same owner (the Node). It watches the slices through one list and watch
// narrowed by field selector to the driver and the node, so a slice
// deleted or changed by anyone else is put back.
package slicepub

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/draapi"
)

// DriverResources are the slices to publish, by pool name.
type DriverResources struct {
	Pools map[string]Pool
}

// Pool is one pool's slices, in order: a slice's index is part of its name.
type Pool struct {
	Slices []Slice
}

// Slice is one ResourceSlice's devices or counter sets.
type Slice struct {
	Devices        []resourceapi.Device
	SharedCounters []resourceapi.CounterSet
}

// API is the part of the API server the publisher uses (draapi.Client).
type API interface {
	ListSlices(ctx context.Context, selector string, fromCache bool) (*resourceapi.ResourceSliceList, error)
	WatchSlices(ctx context.Context, selector, rv string, fn func(draapi.SliceEvent) error) error
	CreateSlice(ctx context.Context, s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error)
	UpdateSlice(ctx context.Context, s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error)
	DeleteSlice(ctx context.Context, name string, uid types.UID, rv string) error
	NodeUID(ctx context.Context, name string) (types.UID, error)
}

// Options configure a Publisher.
type Options struct {
	Driver, Node string
	API          API
	// OnError is told of each failed sync (it is retried with backoff)
	// and of slices the server stored otherwise than written.
	OnError func(ctx context.Context, err error, msg string)
	Log     *slog.Logger
	// MinBackoff and MaxBackoff bound the wait before a failed sync is
	// retried, doubling from the first to the second; zero: 1 s and 2 min.
	MinBackoff, MaxBackoff time.Duration
}

// The name's parts, as the upstream controller makes them.
const (
	indexMinLength = 5
	nameSeparator  = "-"
)

// Publisher keeps the node's slices as the last PublishResources said.
type Publisher struct {
	o      Options
	sel    string
	kick   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	want  *DriverResources
	cache map[string]*resourceapi.ResourceSlice // by name
	// gone are the UIDs the watch saw deleted since the last list: a
	// write's answer that comes after its slice's deletion is not taken.
	gone    map[types.UID]bool
	synced  bool // the first list is in cache
	nodeUID types.UID
}

// Start starts watching the node's slices; nothing is written before the
// first PublishResources. Stop, or ctx's end, stops it.
func Start(ctx context.Context, o Options) *Publisher {
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 2 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.OnError == nil {
		o.OnError = func(context.Context, error, string) {}
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Publisher{
		o: o, sel: draapi.SliceSelector(o.Driver, o.Node), kick: make(chan struct{}, 1), cancel: cancel,
		cache: map[string]*resourceapi.ResourceSlice{}, gone: map[types.UID]bool{},
	}
	p.wg.Add(2)
	go func() { defer p.wg.Done(); p.watch(ctx) }()
	go func() { defer p.wg.Done(); p.work(ctx) }()
	return p
}

// Stop stops the publisher and waits for it. The slices stay.
func (p *Publisher) Stop() {
	p.cancel()
	p.wg.Wait()
}

// PublishResources makes r what is published; the writes follow in the
// background.
func (p *Publisher) PublishResources(_ context.Context, r DriverResources) error {
	r = clone(r)
	// The API stores times in whole seconds.
	for _, pool := range r.Pools {
		for _, s := range pool.Slices {
			for _, d := range s.Devices {
				for i := range d.Taints {
					if t := d.Taints[i].TimeAdded; t != nil {
						d.Taints[i].TimeAdded = &metav1.Time{Time: t.Round(time.Second)}
					}
				}
			}
		}
	}
	p.mu.Lock()
	p.want = &r
	p.mu.Unlock()
	p.trigger()
	return nil
}

func clone(r DriverResources) DriverResources {
	out := DriverResources{Pools: make(map[string]Pool, len(r.Pools))}
	for name, pool := range r.Pools {
		sl := make([]Slice, len(pool.Slices))
		for i, s := range pool.Slices {
			sl[i] = Slice{Devices: make([]resourceapi.Device, len(s.Devices)), SharedCounters: make([]resourceapi.CounterSet, len(s.SharedCounters))}
			for j := range s.Devices {
				s.Devices[j].DeepCopyInto(&sl[i].Devices[j])
			}
			for j := range s.SharedCounters {
				s.SharedCounters[j].DeepCopyInto(&sl[i].SharedCounters[j])
			}
			if len(s.Devices) == 0 {
				sl[i].Devices = nil
			}
			if len(s.SharedCounters) == 0 {
				sl[i].SharedCounters = nil
			}
		}
		out.Pools[name] = Pool{Slices: sl}
	}
	return out
}

func (p *Publisher) trigger() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// work syncs on each trigger, retrying a failed sync with backoff.
func (p *Publisher) work(ctx context.Context) {
	backoff := p.o.MinBackoff
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-retry:
		}
		retry = nil
		err := p.sync(ctx)
		switch {
		case err == nil:
			backoff = p.o.MinBackoff
		case ctx.Err() != nil:
			return
		default:
			p.o.OnError(ctx, err, "publishing ResourceSlices")
			retry = time.After(backoff)
			backoff = min(2*backoff, p.o.MaxBackoff)
		}
	}
}

// sync makes the server's slices what p.want says.
func (p *Publisher) sync(ctx context.Context) error {
	p.mu.Lock()
	want, synced := p.want, p.synced
	have := map[string][]*resourceapi.ResourceSlice{}
	for _, s := range p.cache {
		have[s.Spec.Pool.Name] = append(have[s.Spec.Pool.Name], s)
	}
	p.mu.Unlock()
	if want == nil || !synced {
		return nil
	}
	for _, name := range slices.Sorted(maps.Keys(have)) {
		if _, ok := want.Pools[name]; !ok {
			if err := p.remove(ctx, have[name]); err != nil {
				return fmt.Errorf("removing the slices of pool %s, no longer published: %w", name, err)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want.Pools)) {
		if err := p.syncPool(ctx, name, want.Pools[name], have[name]); err != nil {
			return fmt.Errorf("pool %s: %w", name, err)
		}
	}
	return nil
}

func (p *Publisher) syncPool(ctx context.Context, name string, pool Pool, have []*resourceapi.ResourceSlice) error {
	if err := validate(name, pool); err != nil {
		// Retrying would not help: said once, as the upstream controller.
		p.o.OnError(ctx, err, "pool validation failed")
		return nil
	}
	slices.SortFunc(have, func(a, b *resourceapi.ResourceSlice) int { return strings.Compare(a.Name, b.Name) })
	var gen int64
	for _, s := range have {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	// Each desired slice takes the existing one of its index; the rest,
	// and any of an older generation, go.
	width := indexLength(len(pool.Slices))
	current := map[int]*resourceapi.ResourceSlice{}
	var obsolete []*resourceapi.ResourceSlice
	for _, s := range have {
		i, ok := decodeIndex(s.Name, width)
		if s.Spec.Pool.Generation < gen || !ok || i >= len(pool.Slices) || current[i] != nil {
			obsolete = append(obsolete, s)
			continue
		}
		current[i] = s
	}
	desired := resourceapi.ResourcePool{Name: name, Generation: gen, ResourceSliceCount: int64(len(pool.Slices))}
	changed := map[int]bool{}
	for i, s := range current {
		if !apiequality.Semantic.DeepEqual(s.Spec.Pool, desired) || s.Spec.NodeSelector != nil || ptrTrue(s.Spec.AllNodes) ||
			!devicesEqual(s.Spec.Devices, pool.Slices[i].Devices) ||
			!apiequality.Semantic.DeepEqual(s.Spec.SharedCounters, pool.Slices[i].SharedCounters) ||
			s.Spec.PerDeviceNodeSelection != nil || s.Spec.PartitionTypeAttribute != nil || s.Spec.SkipNodeOperations != nil {
			changed[i] = true
		}
	}
	fresh := len(pool.Slices) - len(current)
	bumped := false
	if fresh > 0 || len(changed) > 1 {
		// Consumers see a pool whole only when every slice has one
		// generation: more than one write means a new one.
		desired.Generation++
		bumped = true
	}
	if err := p.remove(ctx, obsolete); err != nil {
		return err
	}
	for _, i := range slices.Sorted(maps.Keys(current)) {
		if !changed[i] && !bumped {
			continue
		}
		s := current[i].DeepCopy()
		s.Spec.Pool = desired
		s.Spec.NodeSelector, s.Spec.AllNodes = nil, nil
		s.Spec.PerDeviceNodeSelection, s.Spec.PartitionTypeAttribute, s.Spec.SkipNodeOperations = nil, nil, nil
		s.Spec.SharedCounters = pool.Slices[i].SharedCounters
		s.Spec.Devices = keepTimeAdded(current[i].Spec.Devices, pool.Slices[i].Devices)
		got, err := p.o.API.UpdateSlice(ctx, s)
		if err != nil {
			return fmt.Errorf("updating ResourceSlice %s: %w", s.Name, err)
		}
		p.stored(ctx, got, s)
	}
	for i := range pool.Slices {
		if current[i] != nil {
			continue
		}
		uid, err := p.owner(ctx)
		if err != nil {
			return err
		}
		node := p.o.Node
		s := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{
				GenerateName:    encodeIndex(i, width) + nameSeparator + p.o.Driver + nameSeparator + p.o.Node + nameSeparator,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: p.o.Node, UID: uid, Controller: ptrTo(true)}},
			},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: p.o.Driver, Pool: desired, NodeName: &node,
				Devices: pool.Slices[i].Devices, SharedCounters: pool.Slices[i].SharedCounters,
			},
		}
		got, err := p.o.API.CreateSlice(ctx, s)
		if err != nil {
			return fmt.Errorf("creating ResourceSlice %d of %d: %w", i+1, len(pool.Slices), err)
		}
		p.stored(ctx, got, s)
	}
	return nil
}

// remove deletes ss, each only as read (UID and resourceVersion); one
// already gone is no error.
func (p *Publisher) remove(ctx context.Context, ss []*resourceapi.ResourceSlice) error {
	for _, s := range ss {
		err := p.o.API.DeleteSlice(ctx, s.Name, s.UID, s.ResourceVersion)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting ResourceSlice %s: %w", s.Name, err)
		}
		p.mu.Lock()
		if c := p.cache[s.Name]; c != nil && c.UID == s.UID {
			delete(p.cache, s.Name)
		}
		p.mu.Unlock()
	}
	return nil
}

// stored takes a slice the server answered a write with into the cache,
// before its watch event comes, and says when the server stored less than
// was written (a field its features drop).
func (p *Publisher) stored(ctx context.Context, got, wrote *resourceapi.ResourceSlice) {
	p.put(got)
	w := wrote.Spec.Devices
	if len(w) == len(got.Spec.Devices) {
		w = slices.Clone(w)
		for i := range w {
			// The server fills in the times of taints written without one.
			w[i] = *w[i].DeepCopy()
			for j := range w[i].Taints {
				if j < len(got.Spec.Devices[i].Taints) && w[i].Taints[j].TimeAdded == nil {
					w[i].Taints[j].TimeAdded = got.Spec.Devices[i].Taints[j].TimeAdded
				}
			}
		}
	}
	if !apiequality.Semantic.DeepEqual(w, got.Spec.Devices) || !apiequality.Semantic.DeepEqual(wrote.Spec.SharedCounters, got.Spec.SharedCounters) {
		p.o.OnError(ctx, fmt.Errorf("ResourceSlice %s: the API server stored other devices or counters than written: some fields were dropped, probably because their features are disabled on the cluster", got.Name), "publishing ResourceSlices")
		// Our wish becomes what the server stores, so the watch does not
		// make us write it again and again.
		p.mu.Lock()
		if p.want != nil {
			if pool, ok := p.want.Pools[got.Spec.Pool.Name]; ok {
				if i, ok := decodeIndex(got.Name, indexLength(len(pool.Slices))); ok && i < len(pool.Slices) {
					pool.Slices[i] = Slice{Devices: got.Spec.Devices, SharedCounters: got.Spec.SharedCounters}
				}
			}
		}
		p.mu.Unlock()
	}
}

// put takes s into the cache unless the cache has a newer copy.
func (p *Publisher) put(s *resourceapi.ResourceSlice) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.cache[s.Name]; p.gone[s.UID] || c != nil && c.UID == s.UID && olderRV(s.ResourceVersion, c.ResourceVersion) {
		return
	}
	p.cache[s.Name] = s
}

// olderRV says whether a is older than b; resourceVersions are opaque,
// but etcd's are integers, which the upstream mutation cache relies on too.
func olderRV(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x < y
}

// owner is the Node's UID, read once.
func (p *Publisher) owner(ctx context.Context) (types.UID, error) {
	p.mu.Lock()
	uid := p.nodeUID
	p.mu.Unlock()
	if uid != "" {
		return uid, nil
	}
	uid, err := p.o.API.NodeUID(ctx, p.o.Node)
	if err != nil {
		return "", fmt.Errorf("reading Node %s, the owner of its slices: %w", p.o.Node, err)
	}
	p.mu.Lock()
	p.nodeUID = uid
	p.mu.Unlock()
	return uid, nil
}

// watch keeps the cache: a list, then a watch from the list's
// resourceVersion, listing again when the watch can no longer resume.
func (p *Publisher) watch(ctx context.Context) {
	backoff := p.o.MinBackoff
	for ctx.Err() == nil {
		rv, err := p.list(ctx)
		for err == nil && ctx.Err() == nil {
			backoff = p.o.MinBackoff
			rv, err = p.watchFrom(ctx, rv)
		}
		if ctx.Err() != nil {
			return
		}
		if !apierrors.IsGone(err) && !apierrors.IsResourceExpired(err) {
			p.o.Log.Info("DRA: watching this node's ResourceSlices failed; listing them again", "err", err, "after", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, p.o.MaxBackoff)
		}
	}
}

func (p *Publisher) list(ctx context.Context) (string, error) {
	l, err := p.o.API.ListSlices(ctx, p.sel, true)
	if err != nil {
		return "", fmt.Errorf("listing ResourceSlices (%s): %w", p.sel, err)
	}
	cache := map[string]*resourceapi.ResourceSlice{}
	for i := range l.Items {
		if s := &l.Items[i]; p.ours(s) {
			cache[s.Name] = s
		}
	}
	p.mu.Lock()
	p.cache, p.synced, p.gone = cache, true, map[types.UID]bool{}
	p.mu.Unlock()
	p.trigger()
	return l.ResourceVersion, nil
}

// ours says whether s is this driver's and node's: the server's selector
// says so already; a fake or an old server may not filter.
func (p *Publisher) ours(s *resourceapi.ResourceSlice) bool {
	return s.Spec.Driver == p.o.Driver && s.Spec.NodeName != nil && *s.Spec.NodeName == p.o.Node
}

// watchFrom watches from rv and returns the last resourceVersion seen,
// to resume from, when the server ends the watch.
func (p *Publisher) watchFrom(ctx context.Context, rv string) (string, error) {
	err := p.o.API.WatchSlices(ctx, p.sel, rv, func(ev draapi.SliceEvent) error {
		if ev.Slice.ResourceVersion != "" {
			rv = ev.Slice.ResourceVersion
		}
		if ev.Type == "BOOKMARK" || !p.ours(ev.Slice) {
			return nil
		}
		p.mu.Lock()
		c := p.cache[ev.Slice.Name]
		// Our own write's event: the cache has it already. A deletion is
		// never one (ours leave the cache first).
		echo := ev.Type != "DELETED" && c != nil && c.ResourceVersion == ev.Slice.ResourceVersion
		switch ev.Type {
		case "DELETED":
			p.gone[ev.Slice.UID] = true
			if c != nil && c.UID == ev.Slice.UID {
				delete(p.cache, ev.Slice.Name)
			}
		default:
			if c == nil || c.UID != ev.Slice.UID || !olderRV(ev.Slice.ResourceVersion, c.ResourceVersion) {
				p.cache[ev.Slice.Name] = ev.Slice
			}
		}
		p.mu.Unlock()
		if !echo {
			p.trigger()
		}
		return nil
	})
	return rv, err
}

// validate refuses a pool the API would: a device or counter set named
// twice, a counter consumed from a set or counter the pool lacks.
func validate(name string, pool Pool) error {
	sets := map[string]resourceapi.CounterSet{}
	for _, s := range pool.Slices {
		for _, cs := range s.SharedCounters {
			if _, dup := sets[cs.Name]; dup {
				return fmt.Errorf("pool %s: counter set %s is there twice", name, cs.Name)
			}
			sets[cs.Name] = cs
		}
	}
	devs := map[string]bool{}
	for _, s := range pool.Slices {
		for _, d := range s.Devices {
			if devs[d.Name] {
				return fmt.Errorf("pool %s: device %s is there twice", name, d.Name)
			}
			devs[d.Name] = true
			for _, cc := range d.ConsumesCounters {
				cs, ok := sets[cc.CounterSet]
				if !ok {
					return fmt.Errorf("pool %s: device %s consumes from counter set %s, which the pool does not have", name, d.Name, cc.CounterSet)
				}
				for c := range cc.Counters {
					if _, ok := cs.Counters[c]; !ok {
						return fmt.Errorf("pool %s: device %s consumes counter %s, which counter set %s does not have", name, d.Name, c, cc.CounterSet)
					}
				}
			}
		}
	}
	return nil
}

// devicesEqual is semantic equality where a taint without a time equals
// one with, and times a second apart are equal (the API rounds them).
func devicesEqual(a, b []resourceapi.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i].DeepCopy(), b[i].DeepCopy()
		if len(x.Taints) != len(y.Taints) {
			return false
		}
		for j := range x.Taints {
			tx, ty := x.Taints[j].TimeAdded, y.Taints[j].TimeAdded
			if tx != nil && ty != nil {
				if d := tx.Sub(ty.Time); d < -time.Second || d > time.Second {
					return false
				}
			}
			x.Taints[j].TimeAdded, y.Taints[j].TimeAdded = nil, nil
		}
		if !apiequality.Semantic.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// keepTimeAdded is to, where a taint without a time gets the time of the
// same taint (key, value, effect) on the same device in from.
func keepTimeAdded(from, to []resourceapi.Device) []resourceapi.Device {
	out := make([]resourceapi.Device, len(to))
	for i := range to {
		to[i].DeepCopyInto(&out[i])
		k := slices.IndexFunc(from, func(d resourceapi.Device) bool { return d.Name == to[i].Name })
		if k < 0 {
			continue
		}
		for j, t := range out[i].Taints {
			if t.TimeAdded != nil {
				continue
			}
			m := slices.IndexFunc(from[k].Taints, func(f resourceapi.DeviceTaint) bool {
				return f.Key == t.Key && f.Value == t.Value && f.Effect == t.Effect
			})
			if m >= 0 {
				out[i].Taints[j].TimeAdded = from[k].Taints[m].TimeAdded
			}
		}
	}
	return out
}

// indexLength is the width of the index in the names of a pool of n
// slices.
func indexLength(n int) int {
	return max(indexMinLength, len(strconv.FormatInt(int64(n-1), 16)))
}

func encodeIndex(i, width int) string { return fmt.Sprintf("%0*x", width, i) }

// decodeIndex reads the index a name starts with, width hex digits then
// the separator.
func decodeIndex(name string, width int) (int, bool) {
	if strings.Index(name, nameSeparator) != width {
		return 0, false
	}
	i, err := strconv.ParseInt(name[:width], 16, 0)
	if err != nil || i < 0 {
		return 0, false
	}
	return int(i), true
}

func ptrTo[T any](v T) *T { return &v }

func ptrTrue(b *bool) bool { return b != nil && *b }
