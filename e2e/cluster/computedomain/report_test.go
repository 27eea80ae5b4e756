package computedomain

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// report is the lane's figures, written to .report/computedomain.txt.
type report struct {
	published    time.Duration // six plugins started to all channels published
	template     time.Duration // domain created to its template
	prepared     time.Duration // first Prepare to all four prepared
	ready        time.Duration // domain created to status Ready
	attempts     map[string]int
	firstRefusal string
	restarted    time.Duration // daemon killed to a new one running
	readyAgain   time.Duration // daemon killed to the domain Ready with every entry fresh
	restartSeen  []transition
	lostAfter    time.Duration // plugin stopped to NodeLost
	backAfter    time.Duration // plugin continued to Ready
	refusal      string
	tooBig       string
	daemonsGone  time.Duration // domain deleted to no nvidia-imex left
	templateGone time.Duration
	total        time.Duration
	created      time.Time
	timeline     []transition
}

func (r *report) String() string {
	var b strings.Builder
	d := func(x time.Duration) string { return x.Round(10 * time.Millisecond).String() }
	fmt.Fprintf(&b, "ComputeDomain lane: 6 fake GB200 nodes (4 in clique %s, 2 in clique %s), one plugin process each, the controller (resync %s, node timeout %s), the real API server\n\n",
		cliqueA, cliqueB, controllerResync, nodeTimeout)
	fmt.Fprintf(&b, "plugins started to 6 channel devices published   %s\n", d(r.published))
	fmt.Fprintf(&b, "domain created to its ResourceClaimTemplate      %s\n", d(r.template))
	fmt.Fprintf(&b, "domain created to Ready (4 daemons)              %s\n", d(r.ready))
	fmt.Fprintf(&b, "first Prepare to all 4 prepared                  %s (Prepare calls per node, every %s: %s)\n", d(r.prepared), retryEvery, counts(r.attempts))
	fmt.Fprintf(&b, "daemon killed to a new one running               %s\n", d(r.restarted))
	fmt.Fprintf(&b, "daemon killed to Ready, every entry fresh        %s (seen meanwhile: %s)\n", d(r.readyAgain), transitions(r.restartSeen, time.Time{}))
	fmt.Fprintf(&b, "plugin stopped (SIGSTOP) to NodeLost             %s\n", d(r.lostAfter))
	fmt.Fprintf(&b, "plugin continued to Ready                        %s\n", d(r.backAfter))
	fmt.Fprintf(&b, "domain deleted to no nvidia-imex on any node     %s\n", d(r.daemonsGone))
	fmt.Fprintf(&b, "domain deleted to its template gone (GC), at most %s\n", d(r.templateGone))
	fmt.Fprintf(&b, "lane                                             %s\n\n", d(r.total))
	fmt.Fprintf(&b, "first refusal:   %s\n", r.firstRefusal)
	fmt.Fprintf(&b, "other clique:    %s\n", r.refusal)
	fmt.Fprintf(&b, "numNodes 5:      %s\n\n", r.tooBig)
	fmt.Fprintf(&b, "the job's domain, from its creation: %s\n", transitions(r.timeline, r.created))
	return b.String()
}

func counts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// transitions prints status changes, at offsets from origin when set.
func transitions(ts []transition, origin time.Time) string {
	if len(ts) == 0 {
		return "none"
	}
	var parts []string
	for _, t := range ts {
		s := t.status
		if s == "" {
			s = "no status"
		}
		if t.reason != "" {
			s += "/" + t.reason
		}
		if !origin.IsZero() {
			s = fmt.Sprintf("+%s %s", t.at.Sub(origin).Round(10*time.Millisecond), s)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " → ")
}
