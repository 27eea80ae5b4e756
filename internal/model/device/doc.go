// Package device is the vocabulary the device models (gpu, nic) share
// with whatever serves them to Kubernetes: a device and its health, and
// what a container gets for a set of devices.
//
// It exists so that the models know nothing of any kubelet API. The
// device-plugin front-end (package deviceplugin) translates these types
// into v1beta1 messages; a Dynamic Resource Allocation front-end can
// translate the same answers into its own without the models changing.
package device
