package scale

import (
	"fmt"
	"maps"
	"math"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/cluster/auditlog"
)

// phase is what the fleet asked during one part of the run.
type phase struct {
	name     string
	duration time.Duration
	reqs     []auditlog.Request
}

type verbResource struct{ verb, resource string }

// counts is requests by verb and resource.
func (p phase) counts() map[verbResource]int {
	m := map[verbResource]int{}
	for _, r := range p.reqs {
		m[verbResource{r.Verb, r.Resource}]++
	}
	return m
}

func (p phase) writes() int {
	n := 0
	for _, r := range p.reqs {
		if r.Write() {
			n++
		}
	}
	return n
}

func (p phase) count(verb, resource string) int {
	n := 0
	for _, r := range p.reqs {
		if r.Verb == verb && r.Resource == resource {
			n++
		}
	}
	return n
}

// codes lists the response codes that were not 2xx, with their counts.
func (p phase) codes() string {
	m := map[int]int{}
	for _, r := range p.reqs {
		if r.Code >= 300 {
			m[r.Code]++
		}
	}
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d×%d", m[c], c))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// latencies are the server's latencies of the phase's requests but watches.
func (p phase) latencies() []time.Duration {
	var out []time.Duration
	for _, r := range p.reqs {
		if r.Verb != "watch" {
			out = append(out, r.Latency)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// quantile of sorted durations; 0 for none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1 // nearest rank
	return sorted[max(0, min(i, len(sorted)-1))]
}

// clusterWide lists the phase's lists and watches that are not narrowed to
// one node by a field selector: a node agent must never make one.
func (p phase) clusterWide() []string {
	var out []string
	for _, r := range p.reqs {
		if r.Verb != "list" && r.Verb != "watch" {
			continue
		}
		u, err := url.Parse(r.URI)
		if err != nil || !strings.Contains(u.Query().Get("fieldSelector"), "spec.nodeName=") {
			out = append(out, r.Verb+" "+r.URI)
		}
	}
	return out
}
