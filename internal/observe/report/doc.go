// Package report tells the cluster about device health: a Kubernetes
// Event on the Node and on every Pod holding the device at each health
// transition, and a Node condition (GPUHealthy, NICHealthy) that lists the
// unhealthy devices. Both are opt-in.
//
// Transition never blocks and never calls the API: it updates the
// device's state and queues what is to be sent; one goroutine (Run) sends
// it. An XID storm must not flood the API server, so sending is bounded
// three ways:
//
//   - Only state changes (healthy to unhealthy and back) make Events; a
//     reason that changes while the device stays unhealthy updates the
//     condition only.
//   - Aggregation: an Event with the same object, reason and message as
//     one seen less than 10 minutes before is not a new Event. It adds to
//     the count of the existing one, and the count is sent (a PATCH of
//     count and lastTimestamp, as client-go's recorder does) at most once
//     a minute per Event.
//   - A token bucket over every Event write (create or count update):
//     20 at once, then one every 3 seconds. A write without a token waits
//     for one, new Events before count updates; an Event still unsent 10
//     minutes after its last occurrence is dropped. Transitions that find
//     the queue full (1024), and Events beyond 4096 distinct ones in the
//     window, are dropped too. Drops are counted and logged once a minute.
//   - A failed write is logged (once a minute per kind of call) and not
//     retried: the next occurrence of the Event tries again.
//
// The Node condition is not rate-limited: it holds the latest state only,
// so a burst of transitions is one PATCH. It is first sent once the
// devices of its kind have reported (Synced), so a stale False left by an
// earlier run is corrected without a True in between for a device that
// is still broken, and then at every change; a failed PATCH is retried
// with backoff. Its lastTransitionTime changes only when its status does,
// across restarts too: the first PATCH keeps the time the Node already
// has when the status is the same.
package report
