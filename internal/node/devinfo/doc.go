// Package devinfo writes the Device Information files of the Network
// Plumbing Working Group's Device Information Specification (v1.1.0,
// github.com/k8snetworkplumbingwg/device-info-spec, SPEC.md): one JSON file
// per allocated NIC under /var/run/k8s.cni.cncf.io/devinfo/dp, which Multus
// copies into the pod's network-status annotation and hands to CNI plugins
// (host-device, SR-IOV CNI) for the secondary interface it configures.
//
// It takes NIC values from discovery and never reads hardware itself. The
// file format and name are the spec's, not ours: its keys are kebab-case
// ("pci-address"), unlike the lowerCamelCase JSON the plugin emits elsewhere.
//
// The files are derived, not kept: each release writes its whole view of
// a NIC from sysfs and never reads a file's content back, only its name.
// Names are therefore the contract between releases (pinned by tests with
// the previous release's file): the same NIC of the same pool is the same
// file, which the other release overwrites in place or prunes, never a
// second file beside it.
package devinfo
