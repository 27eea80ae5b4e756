// Package kubeapi is the few Kubernetes API calls the device-plugin
// executable makes (Events, a Node condition, a Pod's UID, the Node's
// labels), over net/http and encoding/json. It exists because linking
// client-go and the API types would cost that executable about 35 MiB of
// resident memory for a handful of requests; DRA mode, which needs far
// more of the API, uses client-go in its own executable.
//
// A Client is configured from a kubeconfig file (LoadKubeconfig) or from
// a pod's service account (InCluster). Credentials that rotate on disk
// (a projected service-account token, the kubelet's client certificate)
// are re-read when their files change.
package kubeapi
