// Package cuda is the CUDA probe: it loads the driver's libcuda.so.1 at run
// time (dlopen, never linked, so the plugin starts on nodes without it),
// finds one GPU by its PCI bus ID or UUID, creates a context there, may
// allocate a little memory, and tears it all down, reporting the step that
// failed and its CUresult.
//
// It runs the driver's code in the calling process. The plugin never calls
// it in its own process: package node/cudaprobe runs it in a confined one,
// since a faulted GPU can hang or crash the driver's library.
package cuda
