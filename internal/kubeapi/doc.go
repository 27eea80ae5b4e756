// Package kubeapi is the few Kubernetes API calls the device-plugin
// executable makes (Events, a Node condition, a Pod's UID, the Node's
// labels and its cordon), over net/http and encoding/json. It exists because linking
// client-go and the API types would cost that executable about 35 MiB of
// resident memory for a handful of requests; DRA mode, which needs far
// more of the API, uses client-go in its own executable.
//
// A Client is configured from a kubeconfig file (LoadKubeconfig) or from
// a pod's service account (InCluster). Credentials that rotate on disk
// (a projected service-account token, the kubelet's client certificate)
// are re-read when their files change.
//
// A failed request is a *StatusError when the server answered, carrying
// its Retry-After; Classify sorts any error as Throttled (429, a 5xx with
// Retry-After), Transient (another 5xx, 408, 409, no answer) or Persistent
// (another 4xx: 400, 401, 403, 404, 422, an admission webhook's refusal),
// for the callers' retry policy (package backoff). The Client itself never
// retries. WithRequestObserver counts every request by verb, resource and
// code.
package kubeapi
