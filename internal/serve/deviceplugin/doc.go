// Package deviceplugin serves one extended resource to the kubelet over the
// device-plugin API v1beta1: a gRPC server on a unix socket in the kubelet's
// device-plugin directory, registration with the kubelet, and re-registration
// when the kubelet restarts.
//
// It owns the resource's device list and health and nothing else: what a
// device is, how it is allocated and which devices are preferred come from a
// Backend. It never talks to hardware.
//
// Backends speak the API-neutral types of package device, so the device
// models (gpu, nic) need not import v1beta1; this package is where they are
// translated: devices in ListAndWatch, and a device.Answer into the
// container's allocate response (Response).
package deviceplugin
