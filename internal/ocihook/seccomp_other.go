//go:build !amd64

package ocihook

// arm64 has only the *at calls, all in ldconfigSyscalls; other architectures have no filter.
var archSyscalls []uintptr
