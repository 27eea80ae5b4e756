// Package xid is NVIDIA's XID catalog as this plugin reads it: for each XID
// that matters on Ampere and newer GPUs, its name, the resolution NVIDIA's
// catalog gives it, what health does with it and what the remediation does.
// Health's default XID lists and the remediation's XID decisions are both
// read from it, so the two cannot disagree. It imports nothing of ours.
package xid
