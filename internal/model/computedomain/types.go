package computedomain

import "strconv"

// The API the CRD serves. Group differs from NVIDIA's so both drivers can
// run side by side while nodes are switched one by one; the spec schema is
// NVIDIA's v1beta1, so a manifest converts by its apiVersion line.
const (
	Group    = "gpu-device-plugin.github.io"
	Version  = "v1alpha1"
	Kind     = "ComputeDomain"
	Resource = "computedomains"
	// NVIDIAAPIVersion is the apiVersion `migrate --compute-domains`
	// rewrites.
	NVIDIAAPIVersion = "resource.nvidia.com/v1beta1"
)

// APIVersion is Group/Version.
const APIVersion = Group + "/" + Version

// MaxNodes is the most nodes one NVLink domain holds (NVL72: 18 trays).
const MaxNodes = 18

// Allocation modes of a domain's channel, as NVIDIA's API names them.
const (
	// AllocationSingle gives each claim one channel: the domain's.
	AllocationSingle = "Single"
	// AllocationAll gives each claim every channel of the node.
	AllocationAll = "All"
)

// Spec is what users write. JSON keys are NVIDIA's.
type Spec struct {
	// NumNodes is how many nodes the job spans; each runs one IMEX daemon.
	NumNodes int `json:"numNodes"`
	// Channel names the ResourceClaimTemplate the controller creates for
	// the job's pods to reference.
	Channel *Channel `json:"channel,omitempty"`
}

// Channel is the spec's channel section.
type Channel struct {
	ResourceClaimTemplate TemplateRef `json:"resourceClaimTemplate"`
	// AllocationMode is AllocationSingle (the default) or AllocationAll.
	AllocationMode string `json:"allocationMode,omitempty"`
}

// TemplateRef names a ResourceClaimTemplate in the domain's namespace.
type TemplateRef struct {
	Name string `json:"name"`
}

// The values of Status.Status and Node.Status, as NVIDIA's API has them.
const (
	Ready    = "Ready"
	NotReady = "NotReady"
)

// Reasons: why a domain or a node is not ready. They are API: Events and
// status carry them, docs/compute-domains.md lists them.
const (
	ReasonWaitingForNodes = "WaitingForNodes" // fewer nodes than numNodes have joined
	ReasonDaemonsStarting = "DaemonsStarting" // nodes joined, not all daemons ready
	ReasonMixedCliques    = "MixedCliques"    // nodes in more than one clique: cannot work
	ReasonTooManyNodes    = "TooManyNodes"    // numNodes exceeds what any clique holds
	ReasonInvalidSpec     = "InvalidSpec"     // numNodes < 1, a bad allocation mode
	ReasonNodeLost        = "NodeLost"        // a node stopped reporting
	ReasonDaemonNotReady  = "DaemonNotReady"  // a node's daemon is not ready (node reason)
	ReasonDomainReady     = "DomainReady"
)

// Status is what the controller and the nodes write. status and nodes
// are NVIDIA's keys; reason, message and a node's reason and heartbeat are
// ours.
type Status struct {
	Status  string `json:"status,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Nodes is a map keyed by name (listType=map): each node applies its
	// own entry with a field manager of its own, so nodes never conflict.
	Nodes []Node `json:"nodes,omitempty"`
}

// Node is one node's entry, written by that node.
type Node struct {
	Name      string `json:"name"`
	IPAddress string `json:"ipAddress"`
	// CliqueID is "<clusterUUID>.<clique>", as NVIDIA's driver writes it.
	CliqueID string `json:"cliqueID"`
	Index    int    `json:"index"`
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	// Heartbeat is when the node last wrote its entry (RFC 3339); an
	// entry older than the controller's node timeout is reported lost.
	Heartbeat string `json:"heartbeat,omitempty"`
}

// CliqueID is how a clique is named in status and in the channel
// devices' attributes.
func CliqueID(clusterUUID string, clique uint32) string {
	return clusterUUID + "." + strconv.FormatUint(uint64(clique), 10)
}
