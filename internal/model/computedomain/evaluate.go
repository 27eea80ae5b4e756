package computedomain

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Validate says what is wrong with a spec a user wrote, naming the key and
// the fix; nil when nothing is.
func (s Spec) Validate() error {
	if s.NumNodes < 1 {
		return fmt.Errorf("spec.numNodes: %d is not a node count; give the number of nodes the job spans (1 to %d)", s.NumNodes, MaxNodes)
	}
	if s.Channel == nil || s.Channel.ResourceClaimTemplate.Name == "" {
		return fmt.Errorf("spec.channel.resourceClaimTemplate.name: missing; name the ResourceClaimTemplate the job's pods reference")
	}
	switch s.Channel.AllocationMode {
	case "", AllocationSingle, AllocationAll:
	default:
		return fmt.Errorf("spec.channel.allocationMode: %q is not a mode; use %s or %s", s.Channel.AllocationMode, AllocationSingle, AllocationAll)
	}
	return nil
}

// Facts are what the controller knows beside the spec and the nodes'
// entries.
type Facts struct {
	// CliqueNodes is how many nodes each clique has (by CliqueID), from
	// the channel devices the nodes publish; nil when not known.
	CliqueNodes map[string]int
	// Now and NodeTimeout age the nodes' heartbeats: an entry older than
	// NodeTimeout is lost. A zero NodeTimeout ages nothing.
	Now         time.Time
	NodeTimeout time.Duration
}

// Evaluate computes the domain's status from its spec, the nodes'
// entries and the facts. The nodes are kept as they are, lost ones
// included and marked, sorted by name. Unsatisfiable says the domain
// cannot become ready as it stands (mixed cliques, too many nodes, a bad
// spec): the controller reports it with a warning Event.
func Evaluate(spec Spec, nodes []Node, f Facts) (st Status, unsatisfiable bool) {
	st.Nodes = slices.Clone(nodes)
	slices.SortFunc(st.Nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	var lost []string
	for i := range st.Nodes {
		n := &st.Nodes[i]
		if f.NodeTimeout > 0 && isStale(n.Heartbeat, f.Now, f.NodeTimeout) {
			n.Status, n.Reason = NotReady, ReasonNodeLost
			lost = append(lost, n.Name)
		}
	}
	notReady := func(reason, msg string, bad bool) (Status, bool) {
		st.Status, st.Reason, st.Message = NotReady, reason, msg
		return st, bad
	}
	if err := spec.Validate(); err != nil {
		return notReady(ReasonInvalidSpec, err.Error(), true)
	}
	if spec.NumNodes > MaxNodes {
		return notReady(ReasonTooManyNodes, fmt.Sprintf("spec.numNodes is %d; an NVLink domain holds at most %d nodes", spec.NumNodes, MaxNodes), true)
	}
	if most, clique := largest(f.CliqueNodes); f.CliqueNodes != nil && spec.NumNodes > most {
		return notReady(ReasonTooManyNodes, fmt.Sprintf("spec.numNodes is %d; the largest clique (%s) has %d nodes", spec.NumNodes, clique, most), true)
	}
	cliques := map[string][]string{}
	for _, n := range st.Nodes {
		cliques[n.CliqueID] = append(cliques[n.CliqueID], n.Name)
	}
	if len(cliques) > 1 {
		var parts []string
		for _, id := range sortedKeys(cliques) {
			parts = append(parts, fmt.Sprintf("%s: %s", id, strings.Join(cliques[id], ",")))
		}
		return notReady(ReasonMixedCliques, "the domain's nodes are in more than one clique, which NVLink does not join ("+strings.Join(parts, "; ")+"); delete the pods outside one clique, or use a nodeSelector on nvidia.com/gpu.clique", true)
	}
	if len(lost) > 0 {
		return notReady(ReasonNodeLost, "nodes stopped reporting: "+strings.Join(lost, ","), false)
	}
	ready := 0
	var waiting []string
	for _, n := range st.Nodes {
		if n.Status == Ready {
			ready++
		} else {
			waiting = append(waiting, n.Name)
		}
	}
	switch {
	case len(st.Nodes) < spec.NumNodes:
		return notReady(ReasonWaitingForNodes, fmt.Sprintf("%d of %d nodes joined", len(st.Nodes), spec.NumNodes), false)
	case ready < spec.NumNodes:
		return notReady(ReasonDaemonsStarting, fmt.Sprintf("%d of %d IMEX daemons ready; waiting for %s", ready, spec.NumNodes, strings.Join(waiting, ",")), false)
	}
	st.Status, st.Reason, st.Message = Ready, ReasonDomainReady, fmt.Sprintf("%d nodes ready", ready)
	return st, false
}

func isStale(heartbeat string, now time.Time, timeout time.Duration) bool {
	t, err := time.Parse(time.RFC3339, heartbeat)
	return err != nil || now.Sub(t) > timeout
}

func largest(m map[string]int) (int, string) {
	most, at := 0, ""
	for _, k := range sortedKeys(m) {
		if m[k] > most {
			most, at = m[k], k
		}
	}
	return most, at
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Peers are the addresses nvidia-imex on a node of clique must know: the
// domain's nodes in that clique, itself included (IMEX lists every node),
// sorted so the file does not change when entries are reordered. A lost
// node stays listed: IMEX waits for a peer that comes back.
func Peers(nodes []Node, clique string) []string {
	var ips []string
	for _, n := range nodes {
		if n.CliqueID == clique && n.IPAddress != "" {
			ips = append(ips, n.IPAddress)
		}
	}
	slices.Sort(ips)
	return slices.Compact(ips)
}
