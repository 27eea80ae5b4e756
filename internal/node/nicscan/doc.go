// Package nicscan keeps the configured NIC pools in step with sysfs for
// either front-end: it scans at start and every nicRescanInterval, folds
// each scan into the pools, and passes the result on (CDI specs, metrics,
// CNI device-information files, the front-end's device lists). It serves
// nothing to the kubelet itself.
package nicscan
