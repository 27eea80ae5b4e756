// Package scale measures what a fleet of the plugin costs the API server:
// N real plugin processes in DRA mode (events and the Node condition on),
// each a node of its own on the mock NVML, against the real-node lane's
// API server (e2e/cluster), driven through a start, a rest and a fault
// storm. The API server's audit log records the fleet's user alone, so
// every request is attributed; its /metrics give what all clients cost
// together. TestScale writes the table and the extrapolation to
// .report/scale.txt and fails when the fleet writes at rest or a burst of
// XIDs costs more than the stated budget (docs/api-load.md).
//
// Run it with `make e2e-scale` on a cluster `make e2e-cluster` left up.
package scale
