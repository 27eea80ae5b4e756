// Package sysfs reads PCI facts (canonical addresses, NUMA nodes) from a
// sysfs tree whose root is a parameter, so tests can point it at a fake tree
// in t.TempDir() and containers can point it at a host mount.
//
// It never touches NVML or any other driver library: it only parses strings
// and reads files.
package sysfs
