// Package runtimes reads the node's container runtime configuration and
// says whether a pod that asks for no GPU can still get every GPU by
// setting NVIDIA_VISIBLE_DEVICES in its image or its env. That door is
// open where NVIDIA's runtime (or its legacy prestart hook) runs every
// container and accepts the variable from unprivileged ones.
//
// It reads files under a root it is given (the host's root as mounted in
// this container), never changes them, and reports one plain value. A
// file it cannot parse makes the answer unknown; it never fails start-up.
package runtimes
