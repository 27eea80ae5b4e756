// Package daemon is the serve command's long-running process, and wiring
// only: it discovers devices, hands them to one front-end (dpnode for the
// device-plugin API, or DRA's through WithDRA), has their health watched
// and the NIC pools rescanned (nicscan), and runs reporting. Data flows one
// way: discovery → model → front-end. Snapshot takes the same steps once,
// for the commands that show the node (list, allocate, cdi generate).
package daemon
