// Package draslice builds what DRA mode publishes for the node's devices:
// the ResourceSlice device entries (names, attributes, capacity) of GPUs
// and pooled NICs, and the taints of unhealthy ones, in plain Go types
// whose JSON is the API's. It imports no Kubernetes code, so `list` can
// show the entries from the lean device-plugin executable; package dra
// turns them into API objects.
package draslice
