// Package daemon is the serve command's long-running process: it discovers
// devices, builds each resource from what was found, and runs one
// kubelet-facing server per resource until its context ends. Data flows one
// way: discovery → resource model → server.
package daemon
