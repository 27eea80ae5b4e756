// Package computedomain is the ComputeDomain lane: six fake GB200 nodes
// on two cliques (four in one, two in the other), each a DRA plugin
// process of its own on the mock NVML with its own node IP (127.0.0.x),
// driver root and stand-in nvidia-imex (e2e/imexstub), and the
// ComputeDomain controller as a process, against the real API server the
// cluster lane starts (e2e/cluster). No kubelet serves these nodes: the
// test is the scheduler (it writes the claims' allocations) and the
// kubelet (it calls each plugin's DRA gRPC socket).
//
// TestComputeDomain checks what docs/compute-domains.md promises: a
// four-node job in one clique gets the same channel once its daemons are
// ready, and not before; a killed daemon is restarted and the domain is
// Ready again; a node stopped is reported lost and comes back; a node of
// the other clique is refused with the reason; an unsatisfiable domain
// says so in its status and an Event; deleting the domain stops every
// daemon, and Unprepare leaves nothing behind. Figures go to
// .report/computedomain.txt.
//
// Run it with `make e2e-computedomain` on a cluster `make e2e-cluster`
// left up.
package computedomain
