// Package dra is the Dynamic Resource Allocation front-end: it serves the
// node's GPUs and NIC pools to the kubelet as a DRA driver, through the
// kubeletplugin helper of k8s.io/dynamic-resource-allocation. A GPU in MIG
// mode is served as its MIG devices (type "mig"), whatever the
// device-plugin API's MIG strategy.
//
// It translates the shared model (discovered GPUs, NIC pools, health
// reasons, CDI names) into DRA's terms: one ResourceSlice pool per node
// whose devices carry attributes for CEL selectors and taints for
// unhealthy devices; Prepare answers with CDI device IDs and keeps a
// checkpoint so claims outlive a plugin restart; health reaches each pod's
// allocatedResourcesStatus with the reason as its message. It knows
// nothing of the device-plugin API, as deviceplugin knows nothing of DRA.
//
// Writes to the API server are the helper's ResourceSlice controller's:
// the driver hands it the slices at start and when devices change, and
// debounces health changes (250 ms quiet, 1 s at most, once a second at
// most), never handing over slices identical to the last ones. The
// controller writes only the slices that differ from its informer's copy;
// client-go waits out a 429's or 5xx's Retry-After (up to 10 tries) and
// the controller's workqueue retries a failed sync with per-pool
// exponential backoff (5 ms doubling to 1000 s).
package dra
