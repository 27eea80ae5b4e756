// Package nic serves pools of PCI NICs (RDMA, GPUDirect, DPDK) as
// extended resources: it sorts discovered NICs into the pools the config
// file defines, keeps each pool's device list and health across rescans,
// and answers allocation as a device.Answer.
//
// It knows no kubelet API: a front-end (package deviceplugin, through
// the daemon) translates its devices and answers, so the same pools can
// back another front-end alike.
//
// Of the configuration it takes only the pools' entries
// (config.NICResource and its NICSelectors), plain values config decodes
// and validates, and reads them once, in NewPools; it calls nothing of
// config while the pools serve.
//
// It never reads hardware itself: every fact comes from a sysfs.NIC scan
// handed in by the caller, and the only thing it checks on disk is which
// shared device nodes exist under the /dev root.
package nic
