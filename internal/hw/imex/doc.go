// Package imex finds and makes the IMEX channel device nodes of
// multi-node NVLink (GB200 and GB300 NVL72 racks): a job whose pods span
// nodes of one NVLink domain shares GPU memory over IMEX only if every pod
// has the same channel, /dev/nvidia-caps-imex-channels/channel<N>.
//
// The driver registers the character device "nvidia-caps-imex-channels" in
// /proc/devices when it has IMEX support, but makes no channel node: the
// minor is the channel number, and whoever hands a channel out makes its
// node (as nvidia-modprobe -i <N> does). Major reads the major, EnsureChannel
// makes a node, Channels lists those present.
//
// Roots are parameters: procRoot is the host's /proc, devRoot the host's
// /dev, as this process sees them. The package never calls NVML and decides
// nothing about which channels a container gets.
package imex
