package sharing

import (
	"path/filepath"
	"strconv"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/device"
)

// The directories of one GPU's MPS control daemon under the MPS root
// (MPSDir).
const (
	// MPSPipe holds the daemon's control socket and its servers' pipes;
	// clients connect through it.
	MPSPipe = "pipe"
	// MPSLog holds the daemon's and its servers' logs.
	MPSLog = "log"
	// MPSShm is the daemon's /dev/shm, which its clients must share.
	MPSShm = "shm"
)

// MPSDir is one of a GPU's MPS directories (MPSPipe, MPSLog, MPSShm):
// <root>/<uuid>/<which>.
func MPSDir(root, uuid, which string) string { return filepath.Join(root, uuid, which) }

// MPS environment of a container: the pipe directory it finds its daemon
// through, and its limits.
const (
	MPSPipeEnv         = "CUDA_MPS_PIPE_DIRECTORY"
	MPSThreadEnv       = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	MPSPinnedMemoryEnv = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// MPSContainerPipeDir is where the pipe directory is mounted in a
// container: MPS's own default, so a client that clears
// CUDA_MPS_PIPE_DIRECTORY still reaches its daemon and not, through a
// context of its own, the whole GPU.
const MPSContainerPipeDir = "/tmp/nvidia-mps"

// MPSClient is what a container needs to be a client of the MPS daemon of
// the GPU with uuid (directories under root), limited to threadPercent of
// its threads and memoryMiB of its memory (0: no limit of its own): the
// pipe directory and the daemon's shared memory mounted, and its limits in
// the environment. The limits can only narrow what the daemon allows each
// client, so a container that changes them gets no more than that.
func MPSClient(root, uuid string, threadPercent int, memoryMiB uint64) (map[string]string, []device.Mount) {
	env := map[string]string{
		MPSPipeEnv:   MPSContainerPipeDir,
		MPSThreadEnv: strconv.Itoa(threadPercent),
	}
	if memoryMiB > 0 {
		// Device 0: a client sees the one GPU its daemon was started for.
		env[MPSPinnedMemoryEnv] = "0=" + strconv.FormatUint(memoryMiB, 10) + "M"
	}
	return env, []device.Mount{
		{ContainerPath: MPSContainerPipeDir, HostPath: MPSDir(root, uuid, MPSPipe)},
		{ContainerPath: "/dev/shm", HostPath: MPSDir(root, uuid, MPSShm)},
	}
}
