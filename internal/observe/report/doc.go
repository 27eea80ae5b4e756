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
//   - A failed write pauses every Event write for the wait of package
//     backoff's policy: 1 s, doubling with full jitter up to 5 min, from
//     30 s for a persistent error (401, 403, an admission webhook's
//     refusal), never shorter than the server's Retry-After; the first
//     write that succeeds ends the run. The failed write itself is
//     dropped, the next occurrence of the Event trying again, except
//     when the server throttled it (429, or a 5xx with Retry-After): it
//     was not processed, and is sent once the wait is over. One failure
//     ends the round, so a refusing server sees one request per wait, not
//     one per transition. Failures are logged once a minute per kind of
//     call, with their class and the pause.
//   - A throttled answer to any request (an Event's, the condition's, a
//     read) holds every write of the reporter, Events and conditions,
//     until the server's wait is over.
//
// The Node condition holds the latest state only, so a burst of
// transitions is one PATCH, and it is sent at most once a second (a
// device flapping is not a PATCH per flap). It is first sent once the
// devices of its kind have reported (Synced), so a stale False left by an
// earlier run is corrected without a True in between for a device that
// is still broken, and then at every change; changes that cancel out
// before the next send (a device down and up again) send nothing, so at
// rest the condition is never written. A failed PATCH is retried by the
// same backoff policy, each condition on its own run. Its
// lastTransitionTime changes only when its status does, across restarts
// too: the first PATCH keeps the time the Node already has when the
// status is the same.
package report
