package xid

import (
	"fmt"
	"slices"
)

// Source is the catalog every row's bucket was read from: NVIDIA's "Xid
// Catalog" table for Ampere and newer GPUs, its column "Resolution Bucket
// (Immediate Action)".
const Source = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"

// Bucket is the resolution NVIDIA's catalog gives an XID, spelt as the
// catalog spells it.
type Bucket string

// The buckets the catalog's rows use.
const (
	BucketRestartApp       Bucket = "RESTART_APP"         // restart the application; the GPU is fine
	BucketIgnore           Bucket = "IGNORE"              // nothing to do
	BucketResetGPU         Bucket = "RESET_GPU"           // the GPU needs a reset
	BucketRestartBM        Bucket = "RESTART_BM"          // the node (bare metal) needs a restart
	BucketRestartVM        Bucket = "RESTART_VM"          // the virtual machine needs a restart
	BucketContactSupport   Bucket = "CONTACT_SUPPORT"     // NVIDIA's support must look
	BucketCheckMechanicals Bucket = "CHECK_MECHANICALS"   // cabling or power
	BucketCheckUVM         Bucket = "CHECK_UVM"           // the unified memory driver
	BucketUpdateSWFW       Bucket = "UPDATE_SWFW"         // update the software or firmware
	BucketXID154           Bucket = "XID_154"             // says what another XID's recovery is
	BucketWorkflowXID45    Bucket = "WORKFLOW_XID_45"     // follow the XID it came with
	BucketWorkflowXID48    Bucket = "WORKFLOW_XID_48"     // a GPU reset or node reboot clears it
	BucketWorkflowNVLink   Bucket = "WORKFLOW_NVLINK_ERR" // a GPU reset or node reboot clears it
	BucketWorkflowNVLink5  Bucket = "WORKFLOW_NVLINK5_ERR"
)

// Class is what health does with an XID. Its values are the words the
// xids setting takes.
type Class string

// The classes.
const (
	// Ignore: the application's fault, or nothing to do; the GPU stays
	// healthy.
	Ignore Class = "ignore"
	// Transient: unhealthy for the recovery period after the last one.
	Transient Class = "transient"
	// Fatal: unhealthy until the driver says the GPU was reset.
	Fatal Class = "fatal"
)

// Classes lists the classes, mildest first.
func Classes() []Class { return []Class{Ignore, Transient, Fatal} }

// Remedy is what the remediation does for an XID when the driver names no
// recovery action. Its values are the remediation's decisions (package
// remedy's Decision).
type Remedy string

// The remedies an XID can call for.
const (
	RemedyWatch  Remedy = "watch"  // nothing: health's rules keep the GPU out and let it back
	RemedyReset  Remedy = "reset"  // drain, reset when idle, probe, give back
	RemedyHuman  Remedy = "human"  // withhold until a human has looked
	RemedyReboot Remedy = "reboot" // withhold and say the node needs a reboot
)

// Entry is one XID of the catalog.
type Entry struct {
	XID uint64
	// Name is the short name reasons, Events and list show after the
	// XID ("xid=79: fallen off the bus").
	Name string
	// Bucket is NVIDIA's immediate action for it.
	Bucket Bucket
	// Health is what health does with it by default: the bucket's class
	// (ClassOf), unless Note says why not.
	Health Class
	// Remedy is what the remediation does, and Why why; RemedyWatch with
	// an empty Why for an XID the remediation leaves to health.
	Remedy Remedy
	Why    string
	// Note says why Health or Remedy is not what the bucket alone gives.
	Note string
}

// ClassOf is the class a bucket gives: the GPU needs nothing from us
// (ignore), a reset or a reboot (fatal), or a judgement we cannot make
// here (transient, as any XID the catalog does not list).
func ClassOf(b Bucket) Class {
	switch b {
	case BucketRestartApp, BucketIgnore, BucketXID154, BucketWorkflowXID45:
		return Ignore
	case BucketResetGPU, BucketRestartBM, BucketWorkflowXID48, BucketWorkflowNVLink:
		return Fatal
	}
	return Transient
}

// RemedyOf is the remedy a bucket gives, and why.
func RemedyOf(b Bucket) (Remedy, string) {
	switch b {
	case BucketResetGPU, BucketWorkflowXID48, BucketWorkflowNVLink:
		return RemedyReset, "NVIDIA's catalog asks for a GPU reset (" + string(b) + ")"
	case BucketRestartBM:
		return RemedyReboot, "NVIDIA's catalog asks for a node restart (" + string(b) + ")"
	}
	return RemedyWatch, ""
}

// row is a catalog row whose class and remedy are its bucket's.
func row(x uint64, name string, b Bucket) Entry {
	r, why := RemedyOf(b)
	return Entry{XID: x, Name: name, Bucket: b, Health: ClassOf(b), Remedy: r, Why: why}
}

// because gives e a remedy of its own, with why.
func (e Entry) because(r Remedy, why string) Entry {
	e.Remedy, e.Why = r, why
	return e
}

// noted sets e's class, and says why it is not the bucket's.
func (e Entry) noted(c Class, note string) Entry {
	e.Health, e.Note = c, note
	return e
}

// catalog holds every XID the catalog says occurs on A100, H100, B100 or
// GB200 and gives a bucket, and the unused 56, 57 and 61, which older
// GPUs report. XIDs after 161 have no bucket in the catalog yet.
var catalog = []Entry{
	row(8, "GPU stopped processing", BucketRestartApp),
	row(11, "invalid or corrupted push buffer stream", BucketRestartApp),
	row(13, "graphics engine exception", BucketRestartApp),
	row(14, "injected error", BucketIgnore),
	row(25, "invalid or illegal push buffer stream", BucketRestartApp),
	row(31, "GPU memory page fault", BucketRestartApp),
	row(32, "push buffer DMA error", BucketRestartApp),
	row(37, "driver firmware error", BucketIgnore),
	row(38, "driver firmware watchdog timeout", BucketIgnore),
	row(39, "copy engine exception (CE0)", BucketRestartApp),
	row(40, "copy engine exception (CE1)", BucketRestartApp),
	row(41, "copy engine exception (CE2)", BucketRestartApp),
	row(43, "GPU stopped processing", BucketIgnore),
	row(44, "graphics engine fault during context switch", BucketIgnore),
	row(45, "preemptive cleanup", BucketWorkflowXID45),
	row(46, "GPU timeout", BucketResetGPU),
	row(48, "double-bit ECC error", BucketWorkflowXID48).
		because(RemedyReset, "double-bit ECC error: a reset clears the GPU's state and applies the page retirement or row remap (nvidia-smi names this case for --gpu-reset)"),
	row(54, "auxiliary power not connected", BucketCheckMechanicals),
	row(56, "display channel exception (unused on Ampere and newer)", BucketContactSupport),
	row(57, "memory link training failure (unused on Ampere and newer)", BucketContactSupport),
	row(60, "video processor exception", BucketRestartApp),
	row(61, "internal micro-controller breakpoint (unused on Ampere and newer)", BucketContactSupport),
	row(62, "internal micro-controller halt", BucketResetGPU),
	row(63, "ECC page retirement or row remapping recorded", BucketIgnore),
	row(64, "ECC page retirement or row remapping failed", BucketResetGPU).
		because(RemedyHuman, "a page retirement or row remap could not be recorded: the memory may be failing, a human decides (RMA)"),
	row(66, "illegal access by driver", BucketIgnore),
	row(67, "illegal access by driver", BucketIgnore),
	row(68, "video decoder exception", BucketRestartApp),
	row(69, "graphics engine class error", BucketRestartApp),
	row(70, "copy engine error (CE3)", BucketRestartApp),
	row(71, "copy engine error (CE4)", BucketRestartApp),
	row(72, "copy engine error (CE5)", BucketRestartApp),
	row(74, "NVLink error", BucketWorkflowNVLink).
		because(RemedyReset, "NVLink error: a reset retrains the GPU's links"),
	row(75, "copy engine error (CE6)", BucketRestartApp),
	row(76, "copy engine error (CE7)", BucketRestartApp),
	row(77, "copy engine error (CE8)", BucketRestartApp),
	row(78, "vGPU start error", BucketUpdateSWFW),
	row(79, "fallen off the bus", BucketRestartBM).
		because(RemedyReboot, "fallen off the bus: NVML cannot reach the GPU to reset it"),
	row(80, "corrupted data sent to GPU", BucketRestartApp),
	row(82, "JPEG decoder error (NVJPG0)", BucketRestartApp),
	row(83, "video decoder error (NVDEC1)", BucketRestartApp),
	row(84, "video decoder error (NVDEC2)", BucketRestartApp),
	row(85, "copy engine error (CE9)", BucketRestartApp),
	row(86, "optical flow accelerator exception", BucketRestartApp),
	row(88, "video decoder error (NVDEC3)", BucketRestartApp),
	row(89, "video decoder error (NVDEC4)", BucketRestartApp),
	row(92, "high single-bit ECC error rate", BucketIgnore),
	row(93, "InfoROM wear limit exceeded", BucketIgnore),
	row(94, "contained ECC error", BucketRestartApp).
		noted(Transient, "the catalog's text asks for a GPU reset when convenient: unhealthy for the recovery period, and the remediation resets it once idle").
		because(RemedyReset, "contained ECC error: a reset applies the row remap"),
	row(95, "uncontained ECC error", BucketResetGPU).
		because(RemedyReset, "uncontained ECC error: every context on the GPU is lost; a reset recovers it"),
	row(96, "video decoder error (NVDEC5)", BucketRestartApp),
	row(97, "video decoder error (NVDEC6)", BucketRestartApp),
	row(98, "video decoder error (NVDEC7)", BucketRestartApp),
	row(99, "JPEG decoder error (NVJPG1)", BucketRestartApp),
	row(100, "JPEG decoder error (NVJPG2)", BucketRestartApp),
	row(101, "JPEG decoder error (NVJPG3)", BucketRestartApp),
	row(102, "JPEG decoder error (NVJPG4)", BucketRestartApp),
	row(103, "JPEG decoder error (NVJPG5)", BucketRestartApp),
	row(104, "JPEG decoder error (NVJPG6)", BucketRestartApp),
	row(105, "JPEG decoder error (NVJPG7)", BucketRestartApp),
	row(106, "SMBPBI test message", BucketIgnore),
	row(107, "SMBPBI test message", BucketIgnore),
	row(108, "NVLink remote translation error", BucketIgnore),
	row(109, "context switch timeout", BucketResetGPU),
	row(110, "security fault", BucketResetGPU),
	row(119, "GSP RPC timeout", BucketResetGPU).
		because(RemedyReset, "GSP RPC timeout: the GPU's firmware stopped answering; a reset restarts it"),
	row(120, "GSP error", BucketResetGPU).
		because(RemedyReset, "GSP error: a reset restarts the GPU's firmware"),
	row(121, "corrected C2C link errors", BucketIgnore),
	row(126, "copy engine error (CE10)", BucketRestartApp),
	row(127, "copy engine error (CE11)", BucketRestartApp),
	row(128, "copy engine error (CE12)", BucketRestartApp),
	row(129, "copy engine error (CE13)", BucketRestartApp),
	row(130, "copy engine error (CE14)", BucketRestartApp),
	row(131, "copy engine error (CE15)", BucketRestartApp),
	row(132, "copy engine error (CE16)", BucketRestartApp),
	row(133, "copy engine error (CE17)", BucketRestartApp),
	row(134, "copy engine error (CE18)", BucketRestartApp),
	row(135, "copy engine error (CE19)", BucketRestartApp),
	row(136, "NVLink training failed", BucketResetGPU),
	row(137, "NVLink privilege error", BucketIgnore),
	row(139, "optical flow accelerator error (OFA1)", BucketRestartApp),
	row(140, "unrecovered ECC error", BucketResetGPU),
	row(141, "CUDA fast path error", BucketIgnore),
	row(142, "video encoder error (NVENC3)", BucketContactSupport),
	row(143, "GPU initialization error", BucketResetGPU),
	row(144, "NVLink SAW error", BucketWorkflowNVLink5),
	row(145, "NVLink RLW error", BucketWorkflowNVLink5),
	row(146, "NVLink TLW error", BucketWorkflowNVLink5),
	row(147, "NVLink TREX error", BucketWorkflowNVLink5),
	row(148, "NVLink NVLPW_CTRL error", BucketWorkflowNVLink5),
	row(149, "NVLink NETIR error", BucketWorkflowNVLink5),
	row(150, "NVLink MSE error", BucketWorkflowNVLink5),
	row(151, "key rotation error", BucketRestartVM),
	row(154, "GPU recovery action changed", BucketXID154),
	row(155, "NVLink software-defined error", BucketResetGPU),
	row(156, "resource retirement event", BucketResetGPU),
	row(157, "resource retirement failure", BucketIgnore),
	row(158, "GPU fatal timeout", BucketResetGPU),
	row(159, "CHI non-data error", BucketCheckUVM),
	row(160, "channel retirement event", BucketIgnore),
	row(161, "channel retirement failure", BucketIgnore),
}

// Catalog is every row, by XID.
func Catalog() []Entry { return slices.Clone(catalog) }

// Lookup is x's row; false for an XID the catalog does not list, which is
// Transient with RemedyWatch.
func Lookup(x uint64) (Entry, bool) {
	i, ok := slices.BinarySearchFunc(catalog, x, func(e Entry, x uint64) int {
		switch {
		case e.XID < x:
			return -1
		case e.XID > x:
			return 1
		}
		return 0
	})
	if !ok {
		return Entry{XID: x, Health: Transient, Remedy: RemedyWatch}, false
	}
	return catalog[i], true
}

// Name is x's short name, or "" for an XID the catalog does not list.
func Name(x uint64) string {
	e, _ := Lookup(x)
	return e.Name
}

// Default lists the XIDs of class c in the catalog, ascending: the
// defaults of xidIgnore (Ignore) and xidFatal (Fatal).
func Default(c Class) []uint64 {
	var out []uint64
	for _, e := range catalog {
		if e.Health == c {
			out = append(out, e.XID)
		}
	}
	return out
}

// ParseClass reads one of Classes.
func ParseClass(s string) (Class, error) {
	if c := Class(s); slices.Contains(Classes(), c) {
		return c, nil
	}
	return "", fmt.Errorf("%q is not ignore, transient or fatal", s)
}
