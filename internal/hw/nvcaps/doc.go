// Package nvcaps has one job: read the minors of NVIDIA capability devices
// (/dev/nvidia-caps/nvidia-cap<N>) from the driver's procfs, so a MIG
// device can be handed to a container with the nodes that grant access
// to it.
//
// The driver publishes each capability as a text file under
// <procRoot>/driver/nvidia/capabilities, holding "DeviceFileMinor: <N>":
// per MIG device the GPU instance's gpu<minor>/mig/gi<G>/access and the
// compute instance's gpu<minor>/mig/gi<G>/ci<C>/access, and globally
// mig/config and mig/monitor. The global two grant control or sight of
// every MIG device on the node, so Global reads them for reporting only.
//
// The package reads files only; it never calls NVML.
package nvcaps
