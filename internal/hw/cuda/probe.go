package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// The driver API's types, as the header has them on 64-bit Linux: CUresult
// an enum, CUdevice an int, CUcontext a pointer, CUdeviceptr 64 bits.
typedef int (*gdp_init_t)(unsigned int);
typedef int (*gdp_by_bus_t)(int *, const char *);
typedef int (*gdp_count_t)(int *);
typedef int (*gdp_get_t)(int *, int);
typedef int (*gdp_uuid_t)(unsigned char *, int);
typedef int (*gdp_ctx_create_t)(void **, unsigned int, int);
typedef int (*gdp_ctx_destroy_t)(void *);
typedef int (*gdp_alloc_t)(unsigned long long *, size_t);
typedef int (*gdp_free_t)(unsigned long long);
typedef int (*gdp_err_name_t)(int, const char **);

typedef struct {
	void *h;
	gdp_init_t init;
	gdp_by_bus_t by_bus;
	gdp_count_t count;
	gdp_get_t get;
	gdp_uuid_t uuid;
	gdp_ctx_create_t ctx_create;
	gdp_ctx_destroy_t ctx_destroy;
	gdp_alloc_t alloc;
	gdp_free_t mem_free;
	gdp_err_name_t err_name;
	void *ctx;
	unsigned long long ptr;
} gdp_cuda;

// The newer entry point where the driver has it (the _v2 ABI of CUDA 4.0+,
// cuDeviceGetUuid_v2 of 11.4+), else the old name.
static void *gdp_sym(void *h, const char *a, const char *b) {
	void *p = dlsym(h, a);
	return p || !b ? p : dlsym(h, b);
}

// gdp_open loads the library; it returns dlerror's words, or NULL.
static const char *gdp_open(gdp_cuda *c, const char *path) {
	c->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!c->h)
		return dlerror();
	c->init = (gdp_init_t)gdp_sym(c->h, "cuInit", NULL);
	c->by_bus = (gdp_by_bus_t)gdp_sym(c->h, "cuDeviceGetByPCIBusId", NULL);
	c->count = (gdp_count_t)gdp_sym(c->h, "cuDeviceGetCount", NULL);
	c->get = (gdp_get_t)gdp_sym(c->h, "cuDeviceGet", NULL);
	c->uuid = (gdp_uuid_t)gdp_sym(c->h, "cuDeviceGetUuid_v2", "cuDeviceGetUuid");
	c->ctx_create = (gdp_ctx_create_t)gdp_sym(c->h, "cuCtxCreate_v2", "cuCtxCreate");
	c->ctx_destroy = (gdp_ctx_destroy_t)gdp_sym(c->h, "cuCtxDestroy_v2", "cuCtxDestroy");
	c->alloc = (gdp_alloc_t)gdp_sym(c->h, "cuMemAlloc_v2", "cuMemAlloc");
	c->mem_free = (gdp_free_t)gdp_sym(c->h, "cuMemFree_v2", "cuMemFree");
	c->err_name = (gdp_err_name_t)gdp_sym(c->h, "cuGetErrorName", NULL);
	return NULL;
}

static int gdp_init(gdp_cuda *c) { return c->init(0); }
static int gdp_by_bus(gdp_cuda *c, int *dev, const char *bus) { return c->by_bus(dev, bus); }
static int gdp_count(gdp_cuda *c, int *n) { return c->count(n); }
static int gdp_get(gdp_cuda *c, int *dev, int i) { return c->get(dev, i); }
static int gdp_uuid(gdp_cuda *c, unsigned char *u, int dev) { return c->uuid(u, dev); }
static int gdp_ctx_create(gdp_cuda *c, int dev) { return c->ctx_create(&c->ctx, 0, dev); }
static int gdp_ctx_destroy(gdp_cuda *c) { int r = c->ctx_destroy(c->ctx); c->ctx = NULL; return r; }
static int gdp_alloc(gdp_cuda *c, size_t n) { return c->alloc(&c->ptr, n); }
static int gdp_free(gdp_cuda *c) { return c->mem_free(c->ptr); }

static const char *gdp_err_name(gdp_cuda *c, int code) {
	const char *s = NULL;
	if (!c->err_name || c->err_name(code, &s) != 0)
		return NULL;
	return s;
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"time"
	"unsafe"
)

// Target is the GPU to probe.
type Target struct {
	// PCIBusID finds the GPU (cuDeviceGetByPCIBusId), in NVML's form
	// (00000000:3B:00.0) or the short one (0000:3b:00.0).
	PCIBusID string
	// UUID (GPU-…) is checked against what CUDA says the GPU is, where the
	// driver has cuDeviceGetUuid; without PCIBusID it finds the GPU.
	UUID string
	// AllocBytes, if not 0, are allocated in the context and freed.
	AllocBytes uint64
}

// Library is libcuda.so.1, loaded. It is never unloaded: a driver library
// that has run cuInit is not made to be.
type Library struct {
	c    *C.gdp_cuda
	path string
}

// Open loads the library at path (see LibraryPath). The error says why
// dlopen failed.
func Open(path string) (*Library, error) {
	c := (*C.gdp_cuda)(C.calloc(1, C.sizeof_gdp_cuda))
	p := C.CString(path)
	defer C.free(unsafe.Pointer(p))
	if msg := C.gdp_open(c, p); msg != nil {
		C.free(unsafe.Pointer(c))
		return nil, fmt.Errorf("loading %s: %s", path, C.GoString(msg))
	}
	return &Library{c: c, path: path}, nil
}

// Probe probes t: cuInit, the GPU found, its UUID checked, a context
// created, AllocBytes allocated and freed, the context destroyed. began,
// if set, is called before each step, so a caller that sees the process
// hang knows where. Every call runs on one locked OS thread, as a CUDA
// context is the calling thread's.
func (l *Library) Probe(t Target, began func(Step)) Result {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := time.Now()
	r := l.probe(t, func(s Step) {
		if began != nil {
			began(s)
		}
	})
	r.Duration = time.Since(start)
	return r
}

func (l *Library) probe(t Target, began func(Step)) Result {
	c := l.c
	if t.PCIBusID == "" && t.UUID == "" {
		return Result{Step: StepDevice, Message: "no PCI bus ID or UUID given"}
	}
	var missing []string
	for _, f := range []struct {
		name string
		ptr  unsafe.Pointer
		need bool
	}{
		{"cuInit", unsafe.Pointer(c.init), true},
		{"cuDeviceGetByPCIBusId", unsafe.Pointer(c.by_bus), t.PCIBusID != ""},
		{"cuDeviceGetCount", unsafe.Pointer(c.count), t.PCIBusID == ""},
		{"cuDeviceGet", unsafe.Pointer(c.get), t.PCIBusID == ""},
		{"cuDeviceGetUuid", unsafe.Pointer(c.uuid), t.PCIBusID == ""},
		{"cuCtxCreate", unsafe.Pointer(c.ctx_create), true},
		{"cuCtxDestroy", unsafe.Pointer(c.ctx_destroy), true},
		{"cuMemAlloc", unsafe.Pointer(c.alloc), t.AllocBytes > 0},
		{"cuMemFree", unsafe.Pointer(c.mem_free), t.AllocBytes > 0},
	} {
		if f.need && f.ptr == nil {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return Result{Step: StepLoad, Message: fmt.Sprintf("%s lacks %s", l.path, strings.Join(missing, ", "))}
	}
	failed := func(s Step, code C.int, format string, args ...any) Result {
		r := Result{Step: s, Code: int(code), Message: fmt.Sprintf(format, args...)}
		if name := C.gdp_err_name(c, code); name != nil {
			r.Name = C.GoString(name)
		}
		return r
	}

	began(StepInit)
	if rc := C.gdp_init(c); rc != 0 {
		return failed(StepInit, rc, "cuInit(0)")
	}
	var dev C.int
	var uuid string
	if t.PCIBusID != "" {
		began(StepDevice)
		bus := C.CString(t.PCIBusID)
		rc := C.gdp_by_bus(c, &dev, bus)
		C.free(unsafe.Pointer(bus))
		if rc != 0 {
			return failed(StepDevice, rc, "no CUDA device at %s", t.PCIBusID)
		}
		if c.uuid != nil {
			began(StepUUID)
			var err Result
			if uuid, err = l.uuidOf(dev, failed); uuid == "" {
				return err
			}
			if t.UUID != "" && !sameUUID(uuid, t.UUID) {
				return Result{Step: StepUUID, UUID: uuid, Message: fmt.Sprintf("the CUDA device at %s is %s, not %s", t.PCIBusID, uuid, t.UUID)}
			}
		}
	} else {
		began(StepDevice)
		d, found, r := l.byUUID(t.UUID, failed)
		if !found {
			return r
		}
		dev, uuid = d, t.UUID
	}

	began(StepContext)
	if rc := C.gdp_ctx_create(c, dev); rc != 0 {
		r := failed(StepContext, rc, "cuCtxCreate on device %d", int(dev))
		r.UUID = uuid
		return r
	}
	var r Result
	if t.AllocBytes > 0 {
		began(StepAlloc)
		if rc := C.gdp_alloc(c, C.size_t(t.AllocBytes)); rc != 0 {
			r = failed(StepAlloc, rc, "cuMemAlloc of %d bytes", t.AllocBytes)
		} else {
			began(StepFree)
			if rc := C.gdp_free(c); rc != 0 {
				r = failed(StepFree, rc, "cuMemFree")
			}
		}
	}
	// The context goes whatever failed in it; the first failure is the one
	// reported.
	began(StepDestroy)
	if rc := C.gdp_ctx_destroy(c); rc != 0 && r.Step == "" {
		r = failed(StepDestroy, rc, "cuCtxDestroy")
	}
	r.OK, r.UUID = r.Step == "", uuid
	return r
}

// uuidOf is dev's UUID as CUDA gives it (GPU-…), or "" and the failure.
func (l *Library) uuidOf(dev C.int, failed func(Step, C.int, string, ...any) Result) (string, Result) {
	var u [16]byte
	if rc := C.gdp_uuid(l.c, (*C.uchar)(unsafe.Pointer(&u[0])), dev); rc != 0 {
		return "", failed(StepUUID, rc, "cuDeviceGetUuid of device %d", int(dev))
	}
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), Result{}
}

// byUUID finds the device whose UUID is uuid among those CUDA counts, or
// says why not.
func (l *Library) byUUID(uuid string, failed func(Step, C.int, string, ...any) Result) (C.int, bool, Result) {
	var n C.int
	if rc := C.gdp_count(l.c, &n); rc != 0 {
		return 0, false, failed(StepDevice, rc, "cuDeviceGetCount")
	}
	var seen []string
	for i := C.int(0); i < n; i++ {
		var dev C.int
		if rc := C.gdp_get(l.c, &dev, i); rc != 0 {
			return 0, false, failed(StepDevice, rc, "cuDeviceGet(%d)", int(i))
		}
		u, r := l.uuidOf(dev, failed)
		if u == "" {
			return 0, false, r
		}
		if sameUUID(u, uuid) {
			return dev, true, Result{}
		}
		seen = append(seen, u)
	}
	return 0, false, Result{Step: StepDevice, Message: fmt.Sprintf("no CUDA device is %s (CUDA sees %d: %s)", uuid, int(n), strings.Join(seen, ", "))}
}

// sameUUID compares GPU UUIDs as NVML and CUDA write them.
func sameUUID(a, b string) bool {
	norm := func(s string) string {
		return strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(s, "GPU-"), "gpu-"))
	}
	return norm(a) == norm(b)
}
