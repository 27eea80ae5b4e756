// Package computedomain is a ComputeDomain as plain values: the spec users
// write (the same schema as NVIDIA's resource.nvidia.com/v1beta1), the
// status the controller and the nodes write, the decision whether a domain
// is ready or cannot be, and the files nvidia-imex reads. It names no
// Kubernetes type: the controller (internal/control/computedomain) and the
// DRA front-end convert objects to and from these values.
//
// A ComputeDomain is the set of nodes one multi-node job spans inside one
// NVLink domain (a GB200/GB300 NVL72 rack). Every node of the set runs
// nvidia-imex configured with the addresses of the others; every pod of the
// job gets the same IMEX channel. The GPUs of one clique (one NVLink
// partition) reach each other; a domain whose nodes are in two cliques
// cannot work and is reported so.
package computedomain
