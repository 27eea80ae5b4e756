package scale

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// String is the report .report/scale.txt holds.
func (r *report) String() string {
	var b strings.Builder
	n := float64(r.nodes)
	fmt.Fprintf(&b, "Scale lane: %d plugin processes in DRA mode (the real gpu-device-plugin-dra), each a fake node on the mock NVML (%s, %d GPUs), Events and the Node condition on, against one kube-apiserver (the real-node lane's) on this machine.\n", r.nodes, profileName, gpusPerNode)
	fmt.Fprintf(&b, "Requests are the fleet's alone, from the API server's audit log (its user only); per node = fleet total / %d.\n\n", r.nodes)
	fmt.Fprintf(&b, "fleet: started in %s (batches, each published before the next); CPU at rest %.1f ms/s for the fleet (%.2f ms/s a node)\n",
		r.startTook.Round(time.Second), perSecond(r.restCPU, r.restDuration())*1000, perSecond(r.restCPU, r.restDuration())*1000/n)
	b.WriteString(r.memory())
	b.WriteString("\n")

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tlasted\trequests/node\twrites/node\tnon-2xx\tserver latency p50 / p99 / max\tper node, by verb and resource")
	for _, p := range r.phases {
		l := p.latencies()
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.2f\t%s\t%s / %s / %s\t%s\n", p.name, p.duration.Round(100*time.Millisecond),
			float64(len(p.reqs))/n, float64(p.writes())/n, p.codes(),
			ms(quantile(l, .5)), ms(quantile(l, .99)), ms(quantile(l, 1)), p.perNode(r.nodes))
	}
	tw.Flush()

	if len(r.delays) > 0 {
		fmt.Fprintf(&b, "\nstorm: %d XIDs on %d GPUs of every node at once; last XID → ResourceSlice tainted: p50 %s, p99 %s, max %s\n",
			stormRounds*stormGPUs, stormGPUs, ms(quantile(r.delays, .5)), ms(quantile(r.delays, .99)), ms(quantile(r.delays, 1)))
	}
	var ue, re int
	for _, e := range r.events {
		ue += e.unhealthy
		re += e.recovered
	}
	fmt.Fprintf(&b, "Events on the Nodes: %.1f GPUUnhealthy and %.1f GPURecovered a node\n", float64(ue)/n, float64(re)/n)
	if r.sliceBytes > 0 {
		fmt.Fprintf(&b, "one node's ResourceSlice: %d bytes of JSON\n", r.sliceBytes)
	}

	fmt.Fprintf(&b, "\nAPI server metrics over the storm and its recovery (%s, every client: the fleet, the scheduler, the controllers, the real node's kubelet):\n", r.serverWindow.Round(time.Second))
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  resource\tverb\trequests\tp99 (histogram bucket)")
	for _, res := range []string{"resourceslices", "events", "nodes/status", "nodes", "pods"} {
		for _, verb := range []string{"create", "update", "patch", "get", "list", "watch"} {
			k := verbResource{verb, res}
			c := r.server.requests[k]
			if c == 0 {
				continue
			}
			p99, _ := r.server.quantile(.99, func(x verbResource) bool { return x == k })
			fmt.Fprintf(tw, "  %s\t%s\t%.0f\t≤ %s\n", res, verb, c, seconds(p99))
		}
	}
	tw.Flush()
	if len(r.server.watchEvents) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(r.server.watchEvents)) {
			if strings.Contains(strings.ToLower(k), "resourceslice") || strings.Contains(strings.ToLower(k), "event") || strings.EqualFold(k, "nodes") || strings.Contains(k, "Node") {
				parts = append(parts, fmt.Sprintf("%s %.0f", k, r.server.watchEvents[k]))
			}
		}
		fmt.Fprintf(&b, "  watch events sent: %s\n", strings.Join(parts, ", "))
	}

	b.WriteString(r.extrapolation())
	return b.String()
}

// memory is the fleet's resident memory at the end of the rest, a
// process's against its budget (budget.go).
func (r *report) memory() string {
	m := r.mem
	if m.n == 0 {
		return "memory: no process read\n"
	}
	k := float64(m.n)
	return fmt.Sprintf("memory: peak RSS %.0f MiB in all, %.1f MiB a process (budget %.1f MiB, +%.0f %% allowed); after the rest %.1f MiB anonymous (heap, stacks, runtime) and %.1f MiB file-backed (the executable, libc, NVML) a process\n",
		m.peakRSS, m.peakRSS/k, rssBudgetMiB, rssTolerance*100, m.anon/k, m.fileMiB/k)
}

func (r *report) restDuration() time.Duration {
	for _, p := range r.phases {
		if p.name == "rest" {
			return p.duration
		}
	}
	return 0
}

func (r *report) find(name string) phase {
	for _, p := range r.phases {
		if p.name == name {
			return p
		}
	}
	return phase{}
}

// extrapolation scales the per-node figures to 1,000 and 5,000 nodes.
func (r *report) extrapolation() string {
	var b strings.Builder
	n := float64(r.nodes)
	rest, start, fault, rec := r.find("rest"), r.find("start"), r.find("fault"), r.find("recovery")
	restWritesPerHour := float64(rest.writes()) / n / max(rest.duration.Hours(), 1e-9)
	restReqsPerHour := float64(len(rest.reqs)) / n / max(rest.duration.Hours(), 1e-9)
	perFault := float64(fault.writes()+rec.writes()) / n
	startReqs := float64(len(start.reqs)) / n
	b.WriteString("\nExtrapolation (per-node figures above × nodes; the API server and etcd are one each):\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  nodes\twrites/h at rest\trequests/h at rest\twatches held\trollout: requests\tone fault on every node: writes\tthose writes' JSON to watchers of slices")
	for _, nodes := range []float64{n, 1000, 5000} {
		fmt.Fprintf(tw, "  %.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f MiB a watcher\n", nodes, restWritesPerHour*nodes, restReqsPerHour*nodes,
			float64(r.watchesPerNode())*nodes, startReqs*nodes, perFault*nodes,
			float64(r.sliceBytes)*float64(sliceWrites(fault)+sliceWrites(rec))/n*nodes/(1<<20))
	}
	tw.Flush()
	b.WriteString("  (requests at rest leave out the ResourceSlice watch each plugin reopens every 8 minutes: 8 an hour a node, longer than the window measured)\n")
	return b.String()
}

// watchesPerNode is how many watches each plugin held at the end of the
// start (one per informer).
func (r *report) watchesPerNode() int {
	st := r.find("start")
	return int(float64(st.count("watch", "resourceslices"))/float64(r.nodes) + 0.5)
}

// perNode is a phase's requests by verb and resource, per node.
func (p phase) perNode(nodes int) string {
	c := p.counts()
	keys := slices.SortedFunc(maps.Keys(c), func(a, b verbResource) int {
		return strings.Compare(a.resource+" "+a.verb, b.resource+" "+b.verb)
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s %.2f", k.verb, k.resource, float64(c[k])/float64(nodes)))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func perSecond(d, over time.Duration) float64 {
	if over <= 0 {
		return 0
	}
	return d.Seconds() / over.Seconds()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func seconds(s float64) string {
	if s > 1e9 {
		return "+Inf"
	}
	return fmt.Sprintf("%g s", s)
}
