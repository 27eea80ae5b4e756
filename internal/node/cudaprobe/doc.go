// Package cudaprobe runs the CUDA probe (package hw/cuda) on one GPU in a
// confined process of its own, through the hidden cuda-probe command of
// the plugin's executable: the proof that a GPU works, after a reset,
// before it is served again.
//
// Why a process: the driver's library runs in it. A faulted GPU can hang it
// in an ioctl or crash it, and a context it leaves behind would hold the
// GPU. Run kills the process group after a timeout and returns even when
// the kernel cannot reap the process yet.
//
// Why our own executable and not a program of the driver's (as mpsexec
// runs): the probe is our code, linked with the C library of the plugin's
// image, which the driver root may not have. So the library is loaded by
// path from the driver root (cuda.LibraryPath) before the probe's root is
// swapped.
//
// What the process sees (Main, before cuInit):
//   - new mount, PID, IPC, UTS and network namespaces; it is PID 1 of its
//     own, so killing it ends whatever it started;
//   - a read-only tmpfs as its root, with /dev holding only the GPU's node
//     (/dev/nvidia<minor>), nvidiactl, the UVM nodes and null, zero,
//     random and urandom, bound from the plugin's /dev; its own /proc; the
//     sysfs read-only on /sys; and small tmpfs on /tmp and /dev/shm. The
//     plugin's files, the driver root and the host's /dev are out of reach;
//   - no descriptor the plugin leaked (those without close-on-exec are
//     closed first), an environment of its own (PATH only; no
//     CUDA_VISIBLE_DEVICES), and no core dumps.
//
// Which GPU: CUDA sees only the GPU whose device node is there, so cuInit
// touches no other GPU, whatever the others are doing. The probe still
// finds it by PCI bus ID and checks its UUID, so a wrong minor number is a
// failure, not a probe of another GPU.
//
// The process still runs as root with the plugin's capabilities, and can
// do on its GPU whatever the driver's ioctls allow: no seccomp filter yet.
package cudaprobe
