// Package gpu is the nvidia.com/gpu resource: it turns discovered GPUs into
// devices (package device) and answers allocation for them as a
// device.Answer. Everything an answer needs is computed once, when the
// resource is built.
//
// It knows no kubelet API, so one resource can back the device plugin
// (package deviceplugin translates its answers into v1beta1) or another
// front-end alike.
package gpu
