package health

import "github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"

// Policy is the rules a Watcher applies; package policy defines them, apart
// from NVML, so config can build one.
type Policy = policy.Policy
