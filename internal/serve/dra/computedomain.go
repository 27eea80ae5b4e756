package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	cd "github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/draslice"
)

// ChannelConfigKind is the kind of the opaque config a ComputeDomain's
// ResourceClaimTemplate gives its claims (the controller writes it): which
// domain the channel is for.
const ChannelConfigKind = "ComputeDomainChannelConfig"

// channelConfig is ChannelConfigKind's parameters, as the controller
// (internal/control/computedomain.ChannelConfig) writes them.
type channelConfig struct {
	APIVersion      string `json:"apiVersion"`
	Kind            string `json:"kind"`
	DomainUID       string `json:"domainUID"`
	DomainName      string `json:"domainName"`
	DomainNamespace string `json:"domainNamespace"`
	AllocationMode  string `json:"allocationMode,omitempty"`
}

// IMEXDaemons runs this node's nvidia-imex, one per ComputeDomain, by
// the domain's UID; *imexd.Daemons is one. The driver only says which
// domains need one and with which peers: the processes are imexd's.
type IMEXDaemons interface {
	// Ensure runs domain's daemon with peers until ctx ends or Stop.
	Ensure(ctx context.Context, domain string, peers []string) error
	// Ready is nil once the daemon says it is ready, else why not.
	Ready(ctx context.Context, domain string) error
	// Stop stops the daemon and removes its files.
	Stop(domain string) error
	// Sweep stops the daemons, and removes the files, of domains not in keep.
	Sweep(keep []string) error
}

// Domain is a ComputeDomain as the node reads it.
type Domain struct {
	Namespace, Name, UID string
	// Deleting: the domain has a deletion timestamp.
	Deleting bool
	Status   cd.Status
}

// ErrDomainGone is DomainAPI's answer for a domain that does not exist.
var ErrDomainGone = errors.New("ComputeDomain not found")

// DomainAPI reads ComputeDomains and writes this node's entry in their
// status.nodes; apiDomains is the API server's.
type DomainAPI interface {
	GetDomain(ctx context.Context, namespace, name string) (Domain, error)
	// ApplyNode writes n as this node's entry (server-side apply, this
	// node's field manager), RemoveNode takes it out.
	ApplyNode(ctx context.Context, namespace, name string, n cd.Node) error
	RemoveNode(ctx context.Context, namespace, name string) error
}

// ComputeDomainOptions configure the node's side of ComputeDomains
// (Driver.SetComputeDomains).
type ComputeDomainOptions struct {
	API     DomainAPI
	Daemons IMEXDaemons
	// NodeIP is this node's address in the domains' status, the one its
	// nvidia-imex serves peers on.
	NodeIP string
	// Channel readies IMEX channel id's node (imex.EnsureChannel) and
	// says why it cannot.
	Channel func(id int) error
	// Resync is how often the node looks at each domain it takes part in:
	// its heartbeat, its daemon's readiness, new peers, the domain gone.
	// Zero is DefaultDomainResync.
	Resync time.Duration
}

// DefaultDomainResync is ComputeDomainOptions.Resync's default: well
// within the controller's node timeout (2m).
const DefaultDomainResync = 10 * time.Second

// domainChannel is the IMEX channel every pod of a domain gets. A node
// takes part in one domain at a time (its one channel device), so the
// channel need not differ between domains: every node uses channel 0, as
// NVIDIA's driver does for allocationMode Single.
const domainChannel = 0

// preparedDomain is a channel claim's domain and channel, kept in the
// checkpoint so the daemon is stopped when the last claim goes, also
// after a restart.
type preparedDomain struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Channel   int    `json:"channel"`
}

// domains is this node's part in ComputeDomains: the domains it takes
// part in and the claims (prepared, or being prepared) that keep it there.
type domains struct {
	o    ComputeDomainOptions
	node string
	log  *slog.Logger
	now  func() time.Time
	// ctx bounds the daemons' lives: the front-end's.
	ctx context.Context

	mu      sync.Mutex
	clique  string             // this node's clique, from its GPUs; "" none
	members map[string]*member // by domain UID
}

type member struct {
	namespace, name string
	claims          map[types.UID]bool
}

// channelGate is what Prepare of a claim's channel device found: its
// domain, or why the claim cannot be prepared now.
type channelGate struct {
	dom preparedDomain
	err error
}

// SetComputeDomains serves ComputeDomain channel claims with o until ctx
// ends: the channel device is published (on SetGPUs, when the GPUs are in
// an NVLink domain), the domains of the checkpoint's claims are taken up
// again and every other daemon an earlier run left is swept. Call it
// before SetGPUs and before the kubelet can call Prepare.
func (d *Driver) SetComputeDomains(ctx context.Context, o ComputeDomainOptions) error {
	if o.API == nil || o.Daemons == nil || o.Channel == nil {
		return errors.New("dra: ComputeDomains need the API, the IMEX daemons and the channel maker")
	}
	if o.Resync <= 0 {
		o.Resync = DefaultDomainResync
	}
	ds := &domains{o: o, node: d.o.NodeName, log: d.o.Log, now: d.o.Now, ctx: ctx, members: map[string]*member{}}
	d.mu.Lock()
	for uid, p := range d.cp.Claims {
		for _, dv := range p.Devices {
			if dm := dv.Domain; dm != nil {
				ds.add(*dm, uid)
			}
		}
	}
	d.cd = ds
	d.mu.Unlock()
	keep := ds.uids()
	if err := o.Daemons.Sweep(keep); err != nil {
		d.o.Log.Warn("ComputeDomains: sweeping what an earlier run left", "err", err)
	}
	go ds.run(ctx)
	return nil
}

// setClique is told the node's clique by SetGPUs.
func (ds *domains) setClique(c string) {
	ds.mu.Lock()
	ds.clique = c
	ds.mu.Unlock()
}

func (ds *domains) cliqueID() string {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.clique
}

func (ds *domains) add(dm preparedDomain, claim types.UID) {
	m := ds.members[dm.UID]
	if m == nil {
		m = &member{namespace: dm.Namespace, name: dm.Name, claims: map[types.UID]bool{}}
		ds.members[dm.UID] = m
	}
	m.claims[claim] = true
}

func (ds *domains) uids() []string {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	out := make([]string, 0, len(ds.members))
	for uid := range ds.members {
		out = append(out, uid)
	}
	slices.Sort(out)
	return out
}

// channelGates prepares the channel device of each claim not prepared
// before, outside the driver's lock (it asks the API server and the
// daemon): joins the claim's domain and says whether the channel may be
// handed out.
func (d *Driver) channelGates(ctx context.Context, claims []*resourceapi.ResourceClaim) map[types.UID]channelGate {
	d.mu.Lock()
	ds := d.cd
	var todo []*resourceapi.ResourceClaim
	for _, c := range claims {
		if _, done := d.cp.Claims[c.UID]; !done && d.hasChannel(c) {
			todo = append(todo, c)
		}
	}
	d.mu.Unlock()
	if ds == nil || len(todo) == 0 {
		return nil
	}
	out := map[types.UID]channelGate{}
	for _, c := range todo {
		cfg, err := channelConfigOf(d.o.DriverName, c.Status.Allocation.Devices.Config)
		if err != nil {
			out[c.UID] = channelGate{err: err}
			continue
		}
		dom, err := ds.join(ctx, c.UID, cfg)
		out[c.UID] = channelGate{dom: dom, err: err}
	}
	return out
}

// hasChannel says whether c is allocated this node's channel device.
func (d *Driver) hasChannel(c *resourceapi.ResourceClaim) bool {
	if c.Status.Allocation == nil {
		return false
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == d.o.DriverName && r.Pool == d.o.NodeName && r.Device == draslice.ChannelDeviceName {
			return true
		}
	}
	return false
}

// channelConfigOf finds the ChannelConfigKind entry among a claim's
// configs for driver.
func channelConfigOf(driver string, cfgs []resourceapi.DeviceAllocationConfiguration) (channelConfig, error) {
	for _, c := range cfgs {
		if c.Opaque == nil || c.Opaque.Driver != driver {
			continue
		}
		var cc channelConfig
		if err := json.Unmarshal(c.Opaque.Parameters.Raw, &cc); err != nil || cc.Kind != ChannelConfigKind {
			continue
		}
		if cc.APIVersion != ConfigAPIVersion || cc.DomainUID == "" || cc.DomainName == "" || cc.DomainNamespace == "" {
			return cc, fmt.Errorf("the claim's %s names no domain (domainUID, domainName, domainNamespace) or has apiVersion %q; make the claim from the ComputeDomain's ResourceClaimTemplate", ChannelConfigKind, cc.APIVersion)
		}
		return cc, nil
	}
	return channelConfig{}, fmt.Errorf("the claim asks for an IMEX channel and carries no %s; make it from a ComputeDomain's ResourceClaimTemplate (spec.channel.resourceClaimTemplate.name)", ChannelConfigKind)
}

// ErrWrongClique is the reason a claim on a node outside its domain's
// clique is refused.
var ErrWrongClique = errors.New("node outside the ComputeDomain's clique")

// join takes this node into the claim's domain: its entry in the
// domain's status, its daemon with the clique's peers. The channel is
// handed out only once the domain is Ready; until then the error says
// what it waits for, and the kubelet retries.
func (ds *domains) join(ctx context.Context, claim types.UID, cfg channelConfig) (preparedDomain, error) {
	dm := preparedDomain{UID: cfg.DomainUID, Namespace: cfg.DomainNamespace, Name: cfg.DomainName, Channel: domainChannel}
	ref := cfg.DomainNamespace + "/" + cfg.DomainName
	if cfg.AllocationMode == cd.AllocationAll {
		return dm, fmt.Errorf("ComputeDomain %s: allocationMode %s is not served by this driver yet; use %s (the domain's channel)", ref, cd.AllocationAll, cd.AllocationSingle)
	}
	clique := ds.cliqueID()
	if clique == "" {
		return dm, fmt.Errorf("ComputeDomain %s: this node's GPUs are in no NVLink domain (no completed fabric registration); the kubelet retries", ref)
	}
	dom, err := ds.o.API.GetDomain(ctx, cfg.DomainNamespace, cfg.DomainName)
	switch {
	case errors.Is(err, ErrDomainGone), err == nil && (dom.UID != cfg.DomainUID || dom.Deleting):
		return dm, fmt.Errorf("ComputeDomain %s (UID %s) is gone or being deleted; the claim was made for it: delete the pod", ref, cfg.DomainUID)
	case err != nil:
		return dm, fmt.Errorf("ComputeDomain %s: %w; the kubelet retries", ref, err)
	}
	if err := wrongClique(dom, ds.node, clique); err != nil {
		return dm, err
	}
	ds.mu.Lock()
	ds.add(dm, claim)
	ds.mu.Unlock()
	self, err := ds.refresh(ctx, dm.UID, dom, clique)
	if err != nil {
		return dm, err
	}
	if dom.Status.Status != cd.Ready {
		why := dom.Status.Reason
		if dom.Status.Message != "" {
			why += ": " + dom.Status.Message
		}
		if why == "" {
			why = "no status yet"
		}
		return dm, fmt.Errorf("ComputeDomain %s is not ready yet (%s); this node's IMEX daemon is %s; the kubelet retries until the domain is Ready", ref, why, describeEntry(self))
	}
	if err := ds.o.Channel(dm.Channel); err != nil {
		return dm, fmt.Errorf("ComputeDomain %s: IMEX channel %d: %w", ref, dm.Channel, err)
	}
	return dm, nil
}

func describeEntry(n cd.Node) string {
	if n.Status == cd.Ready {
		return "ready"
	}
	return "not ready (" + n.Reason + ")"
}

// wrongClique refuses a node whose clique is not that of the domain's
// other nodes: NVLink does not join cliques, so waiting would not help.
func wrongClique(dom Domain, node, clique string) error {
	var theirs []string
	others := map[string][]string{}
	for _, n := range dom.Status.Nodes {
		if n.Name == node || n.CliqueID == "" {
			continue
		}
		if n.CliqueID != clique {
			if others[n.CliqueID] == nil {
				theirs = append(theirs, n.CliqueID)
			}
			others[n.CliqueID] = append(others[n.CliqueID], n.Name)
		}
	}
	if len(theirs) == 0 {
		return nil
	}
	var parts []string
	for _, c := range theirs {
		parts = append(parts, fmt.Sprintf("%s (%s)", c, strings.Join(others[c], ",")))
	}
	return fmt.Errorf("%w: ComputeDomain %s/%s's nodes are in clique %s, and node %s is in clique %s, which NVLink does not reach; place the job's pods with a nodeSelector on nvidia.com/gpu.clique=%s, or delete this pod",
		ErrWrongClique, dom.Namespace, dom.Name, strings.Join(parts, ", "), node, clique, theirs[0])
}

// refresh runs the domain's daemon with the clique's peers (this node
// included) and writes this node's entry: its address, clique, the
// daemon's readiness and a fresh heartbeat.
func (ds *domains) refresh(ctx context.Context, uid string, dom Domain, clique string) (cd.Node, error) {
	nodes := []cd.Node{{Name: ds.node, IPAddress: ds.o.NodeIP, CliqueID: clique}}
	for _, n := range dom.Status.Nodes {
		if n.Name != ds.node {
			nodes = append(nodes, n)
		}
	}
	ref := dom.Namespace + "/" + dom.Name
	if err := ds.o.Daemons.Ensure(ds.ctx, uid, cd.Peers(nodes, clique)); err != nil {
		return cd.Node{}, fmt.Errorf("ComputeDomain %s: starting this node's IMEX daemon: %w", ref, err)
	}
	self := nodes[0]
	self.Status, self.Reason = cd.Ready, ""
	if err := ds.o.Daemons.Ready(ctx, uid); err != nil {
		self.Status, self.Reason = cd.NotReady, cd.ReasonDaemonNotReady
	}
	self.Heartbeat = ds.now().UTC().Format(time.RFC3339)
	if err := ds.o.API.ApplyNode(ctx, dom.Namespace, dom.Name, self); err != nil {
		return self, fmt.Errorf("ComputeDomain %s: writing this node's entry: %w; the kubelet retries", ref, err)
	}
	return self, nil
}

// release lets go of claims: a domain none of this node's claims needs any
// more is left (its daemon stopped, this node's entry removed).
func (ds *domains) release(ctx context.Context, claims []types.UID) {
	var left []preparedDomain
	ds.mu.Lock()
	for uid, m := range ds.members {
		n := len(m.claims)
		for _, c := range claims {
			delete(m.claims, c)
		}
		if n > 0 && len(m.claims) == 0 {
			delete(ds.members, uid)
			left = append(left, preparedDomain{UID: uid, Namespace: m.namespace, Name: m.name})
		}
	}
	ds.mu.Unlock()
	for _, dm := range left {
		ds.leave(ctx, dm, true)
	}
}

// leave stops the domain's daemon and, when the domain is still there,
// removes this node's entry.
func (ds *domains) leave(ctx context.Context, dm preparedDomain, removeEntry bool) {
	if err := ds.o.Daemons.Stop(dm.UID); err != nil {
		ds.log.Warn("ComputeDomain: stopping the IMEX daemon", "domain", dm.Namespace+"/"+dm.Name, "err", err)
	}
	if removeEntry {
		if err := ds.o.API.RemoveNode(ctx, dm.Namespace, dm.Name); err != nil && !errors.Is(err, ErrDomainGone) {
			ds.log.Warn("ComputeDomain: removing this node's entry", "domain", dm.Namespace+"/"+dm.Name, "err", err)
		}
	}
	ds.log.Info("ComputeDomain: left", "domain", dm.Namespace+"/"+dm.Name, "uid", dm.UID)
}

// run looks at each domain the node takes part in every Resync until ctx
// ends: a domain deleted (or made again under its name) is left, its
// daemon stopped; the others get their heartbeat, readiness and peers.
func (ds *domains) run(ctx context.Context) {
	t := time.NewTicker(ds.o.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ds.resync(ctx)
	}
}

func (ds *domains) resync(ctx context.Context) {
	clique := ds.cliqueID()
	for _, uid := range ds.uids() {
		ds.mu.Lock()
		m := ds.members[uid]
		ds.mu.Unlock()
		if m == nil {
			continue
		}
		dm := preparedDomain{UID: uid, Namespace: m.namespace, Name: m.name}
		dom, err := ds.o.API.GetDomain(ctx, m.namespace, m.name)
		switch {
		case errors.Is(err, ErrDomainGone), err == nil && (dom.UID != uid || dom.Deleting):
			// Its claims stay until the kubelet unprepares them; the
			// daemon does not.
			ds.leave(ctx, dm, false)
			ds.mu.Lock()
			delete(ds.members, uid)
			ds.mu.Unlock()
			continue
		case err != nil:
			ds.log.Warn("ComputeDomain: reading", "domain", m.namespace+"/"+m.name, "err", err)
			continue
		}
		if _, err := ds.refresh(ctx, uid, dom, clique); err != nil {
			ds.log.Warn("ComputeDomain: refreshing this node's part", "domain", m.namespace+"/"+m.name, "err", err)
		}
	}
}
