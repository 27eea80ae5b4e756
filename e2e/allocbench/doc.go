// Package allocbench compares this plugin's preferred-allocation policy
// (allocator.Graph.Choose, exact up to 16 GPUs) with go-gpuallocator's
// best-effort policy, the one NVIDIA's own device plugin uses, on the same
// machines: the mock profiles of e2e/profiles plus a DGX-1 (direct
// NVLinks) from testdata. Both discover the machine from one go-nvml mock
// (NewLibrary), and both answers are scored with this plugin's Score.
//
//	go test ./allocbench -v                          # scores, side by side
//	go test ./allocbench -v -allocbench.report       # plus timings and speed ratios
//	go test ./allocbench -run X -bench . -benchmem   # the benchmarks alone
//
// It lives in the e2e module so the product's go.mod stays free of
// go-gpuallocator.
package allocbench
