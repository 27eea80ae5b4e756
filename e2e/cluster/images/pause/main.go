// Command pause is the local cluster's pod sandbox image: it holds the
// pod's namespaces open and exits on SIGTERM or SIGINT, as
// registry.k8s.io/pause does, without anything to pull.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// As PID 1 of a shared PID namespace it would also reap orphans; a
	// SIGCHLD handler is enough for that, since Go's runtime reaps nothing.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGCHLD)
	<-sig
}
