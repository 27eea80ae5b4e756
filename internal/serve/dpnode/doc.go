// Package dpnode is the device-plugin front-end of a node: one
// deviceplugin.Server per GPU resource (as layout lays them out) and per
// NIC pool, fed from the model, with a NIC's Allocate writing the CNI
// device-information file Multus reads. daemon drives it as it drives the
// DRA front-end (package dra). It never reads hardware itself.
package dpnode
