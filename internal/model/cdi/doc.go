// Package cdi writes Container Device Interface specs
// (https://github.com/cncf-tags/container-device-interface) for the devices
// this plugin serves, so a CDI-enabled runtime (containerd, CRI-O) can inject
// them by name (gpu-device-plugin.github.io/gpu=GPU-…) instead of from the device-plugin
// Allocate answer alone.
//
// It takes plain values (nvml.GPU, the driverroot.Files found under a driver root, a
// /dev root) and never calls NVML. Every spec is checked with the CDI
// library's own validation before it is returned or written, and Writer
// replaces spec files atomically and only ever touches files it owns.
package cdi
