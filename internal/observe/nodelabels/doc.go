// Package nodelabels delivers the node labels (package labels) to the
// Node: through Node Feature Discovery's local feature file, which needs no
// API access, or onto the Node itself through the API server, for clusters
// without NFD.
package nodelabels
