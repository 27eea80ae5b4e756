// Package allocator chooses which devices to prefer for a request, from a
// graph of pairwise link quality built once when devices are discovered.
// It never touches hardware: every answer comes from the graph in memory.
package allocator
