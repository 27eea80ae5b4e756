// Package kubeapitest serves the Kubernetes API paths our REST client
// (package kubeapi) calls, over HTTP, backed by client-go's fake clientset
// and fake dynamic client. Tests that used to hand a daemon a fake
// clientset hand it Serve's Config instead, and keep asserting on the
// fake's contents.
//
// It is for tests only: import it from _test.go files and the e2e
// module's test programs (gpu-check's mock API server), never from a
// shipped binary: it links client-go and its fakes, which the executables
// exist to avoid.
//
// What the fakes lack and a real API server does is done here, for
// requests that come through the server: generateName, field selectors on
// ResourceSlice lists and watches, resourceVersion conflicts on update and
// patch, delete preconditions, and the uid, resourceVersion and
// creationTimestamp an API server sets on what it creates or updates.
// Objects a test writes into the fake directly get none of that: an
// update made there does not change their resourceVersion, so a writer
// through the server does not see a conflict with it.
package kubeapitest
