// Package labels computes the node labels NVIDIA's GPU Feature Discovery
// (GFD) sets, with its names and value formats, from the plugin's own
// discovery and configuration, so that workloads selecting nodes by
// nvidia.com/gpu.product, gpu.memory, mig.capable and the like keep
// scheduling when GFD is replaced. Unlike GFD it is deterministic on a
// node with several GPU models (see Compute) and sets no timestamp.
package labels
