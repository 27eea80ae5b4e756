// Package gpu is the nvidia.com/gpu resource: it turns discovered GPUs into
// device-plugin devices and answers allocation for them. Everything an
// answer needs is computed once, when the resource is built.
package gpu
