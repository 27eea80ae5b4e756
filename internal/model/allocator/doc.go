// Package allocator chooses which devices to prefer for a request, from a
// graph of pairwise link quality built once when devices are discovered
// (and again when they change). It never touches hardware and never calls
// NVML: every answer comes from the graph in memory.
//
// # Score
//
// A request is (available, mustInclude, size). Every answer contains
// mustInclude, lies inside available, has size devices, and maximises
// Score, compared field by field:
//
//  1. Link: the sum of the link weights of every pair in the set. For GPUs
//     the weight is gpu.LinkWeight: 1000 per NVLink (an NVSwitch fabric
//     counts every pair on it as linked with the links each GPU has into
//     it) plus the PCIe proximity, 51 same board down to 1 across CPU
//     sockets. NIC pools weigh 1 for a pair on one NUMA node, else 0.
//  2. NUMA locality: fewer distinct NUMA nodes, then more pairs on the
//     same node. A device whose node is unknown counts as a node of its
//     own and pairs with nothing.
//  3. Remaining: the sum of the link weights among the available devices
//     the set leaves over, so that the next request still finds a good
//     set. Since the total over the available devices is fixed, once Link
//     ties this is the same as taking the devices least connected to the
//     rest: the tightest NUMA node that fits, the partly used NVLink
//     island before a whole one. It never outweighs Link: a request is
//     not given a worse set now to keep a better one for later
//     (go-gpuallocator's partition policy sometimes does; e2e/allocbench
//     shows both).
//
// An exact answer breaks the remaining ties by graph order (discovery
// order, which for GPUs is index order): of two equal sets, the one whose
// first differing device comes first.
//
// # Algorithm
//
// A request that adds one device to mustInclude scores every candidate.
// Otherwise, up to ExactLimit (16) available devices, the answer is
// provably optimal: a branch and bound walks the combinations of the free
// devices as 64-bit masks, in graph order, with the score kept
// incrementally (taking a device adds its gain to the chosen set and
// updates every other gain in O(n); weights, degrees and each device's
// largest weights are precomputed per request). A branch is cut when an
// upper bound cannot beat the best set so far: for Link, the pairs chosen
// so far plus, over the best remaining picks, their gain to the chosen set
// and half the sum of their largest weights to other picks; when Link can
// at best tie, the NUMA and Remaining fields are bounded too. The walk
// starts from the NUMA-grouping and greedy answers below as the set to
// beat, so 16 choose 8 (12870 sets) takes 17 nodes on hgx-16 and one to
// two thousand on random weights. The same search answers larger requests
// (up to 64 devices) whose number of candidate sets is small.
//
// Beyond that a heuristic answers, bounded by heuristicEvals swap
// evaluations and HeuristicBudget of wall-clock time:
//
//  1. NUMA grouping: for each NUMA node, mustInclude plus the devices of
//     that node that score best one at a time, spilling to any node when it
//     runs out. The best of these is the baseline: the answer is never
//     worse.
//  2. Greedy growth, from mustInclude (or nothing) and from the best
//     connected device of each node.
//  3. Local search on those starts, best first: swap one chosen device for
//     one unchosen, the best swap each round, until no swap improves, the
//     budget runs out or the deadline passes. The first round always runs,
//     so a request that leaves one available device out is exact too.
//
// Construction costs O(nodes·size·n) and is not cut short; the local
// search is. On random graphs of 17 to 24 devices the heuristic finds the
// optimum in about 95% of requests.
//
// # Pairing NICs with a pod's GPUs
//
// The nic package uses the same graph with a NUMA weight, so a NIC request
// packs onto one NUMA node. Pairing a container's NICs with the GPUs it
// got (same NUMA node, or better, same PCIe switch for GPUDirect RDMA)
// would need to know which GPUs that is, and the device-plugin API v1beta1
// does not say: neither GetPreferredAllocation nor Allocate carries the
// pod or container. What the kubelet does guarantee is this. It admits
// pods one at a time, and for one container it handles its resources one
// after another: for each, GetPreferredAllocation (only when it has a
// choice to make) and then Allocate, before the next resource. The order
// of the resources is Go map iteration over the container's limits, so it
// is random: the GPUs come first in about half the containers.
//
// So pairing is possible, as a preference, only in this case: both
// resources are served by this process, the GPU Allocate came first, and
// the NIC's GetPreferredAllocation follows it closely. The plugin can then
// remember the last GPU Allocate (its devices and when) and prefer NICs
// near those GPUs, forgetting it once used or after a short time. It is
// not possible, and must not be attempted, when the NICs come first (the
// GPUs are not chosen yet; the reverse preference, GPUs near the last NIC
// allocation, works the same way and has the same limits), when the kubelet
// skips GetPreferredAllocation (it does when it has no choice: the
// NUMA-aligned devices number exactly what is needed, or the devices are
// reused from an init container), or after a kubelet or plugin restart. It
// can also be wrong: a pod that asked only for GPUs followed by one that
// asked only for NICs looks the same as one pod asking for both, which is
// why it may only ever be a preference, never a refusal.
//
// What is reliable is NUMA alignment: both plugins advertise each device's
// NUMA node, and the kubelet's Topology Manager (policy single-numa-node
// or restricted) then gives a Guaranteed pod GPUs and NICs from the same
// node, narrowing available accordingly before it asks either plugin.
// Pairing at the PCIe switch needs the scheduler to see both devices at
// once: Dynamic Resource Allocation with a matchAttribute constraint on
// the PCIe root, not a device plugin.
package allocator
