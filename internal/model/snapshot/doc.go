// Package snapshot is the node as one look sees it: the GPUs NVML found and
// the settings select, how each is served, one health poll, the MIG
// partitions, the MPS daemons' word, the NICs and their pools, what DRA
// mode would publish, and who holds each device. daemon.Snapshot builds it
// with the functions serve runs; list, allocate and cdi generate only show
// it. It holds plain values and does nothing: no NVML, sysfs or kubelet
// call starts here.
package snapshot
