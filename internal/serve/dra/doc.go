// Package dra is the Dynamic Resource Allocation front-end: it serves the
// node's GPUs and NIC pools to the kubelet as a DRA driver: package
// kubelet serves the kubelet's side (registration, Prepare and Unprepare,
// health, device metadata), package slicepub publishes the ResourceSlices
// and package draapi makes the API calls, none with client-go. A GPU in MIG
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
// Writes to the API server are slicepub's: the driver hands it the slices
// at start and when devices change, and debounces health changes (250 ms
// quiet, 1 s at most, once a second at most), never handing over slices
// identical to the last ones. The publisher writes only the slices that
// differ from its watched copy; draapi waits out a 429's or 5xx's
// Retry-After (up to 10 tries) and the publisher retries a failed sync
// with exponential backoff (1 s doubling to 2 min).
package dra
