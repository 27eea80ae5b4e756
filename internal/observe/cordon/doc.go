// Package cordon cordons the plugin's own Node while a GPU needs a node
// reboot (remediation.cordon), and later lifts that cordon, and only that
// one: a Node unschedulable without our annotation is an operator's, and
// is never touched.
//
// Writer makes one read and at most one patch; its patch names the
// resourceVersion it read, so a change made in between (an operator's
// cordon) is not written over. Keeper runs the Writer on its own goroutine,
// retrying by package backoff, so whoever asks (the remediation) never
// waits on the API server.
package cordon
