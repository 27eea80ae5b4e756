package wholebinary

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2/ktesting"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// What imex.channelIDs [0] gives a container, as NVIDIA's device plugin
// gives it: spelt out here rather than imported, so that a rename in the
// plugin fails this lane.
const (
	imexChannel0   = "/dev/nvidia-caps-imex-channels/channel0"
	imexChannelDir = "nvidia-caps-imex-channels"
	imexEnv        = "NVIDIA_IMEX_CHANNELS"
	imexCDIDevice  = "gpu-device-plugin.github.io/gpu=imex-channel0"
	gpuCDIKind     = "gpu-device-plugin.github.io/gpu"
	imexWarning    = "IMEX channels not injected (imex.required is false)"
)

// TestIMEX: device-plugin mode's IMEX channel injection (imex.channelIDs
// [0]) on the real binary. On gb200-tray, whose driver lists
// nvidia-caps-imex-channels in /proc/devices, the plugin makes
// channel0's node under --dev-root from that major and every GPU
// allocation gets it, as a device node (envvar) or as the GPU spec's CDI
// device (cdi-cri). On dgx-h100, whose driver lists no such line,
// imex.required stops the plugin with the reason and the fix before any
// GPU is served; without it, one warning and GPUs served without a
// channel.
func TestIMEX(t *testing.T) {
	t.Run("gb200-tray envvar: the node is made and every allocation gets it", func(t *testing.T) {
		t.Parallel()
		needMknod(t)
		proc := procRoot(t, "gb200-tray")
		major := imexMajor(t, proc)
		n := startNodeWith(t, "gb200-tray", library, "--proc-root", proc, "--imex-channel-ids", "0", "--imex-required", "true")
		host := filepath.Join(n.p.DevRoot, imexChannelDir, "channel0")
		checkChannelNode(t, host, major)

		resp, err := n.e.Allocate(ctx(t), n.uuid(2))
		if err != nil {
			t.Fatal(err)
		}
		var got []*api.DeviceSpec
		for _, d := range resp.Devices {
			if d.ContainerPath == imexChannel0 {
				got = append(got, d)
			}
		}
		if len(got) != 1 || got[0].HostPath != host || got[0].Permissions != "rw" {
			t.Errorf("Allocate's %s devices = %v, want one from %s, rw (all: %v)", imexChannel0, got, host, resp.Devices)
		}
		if v := resp.Envs[imexEnv]; v != "0" {
			t.Errorf("%s = %q, want \"0\"", imexEnv, v)
		}
		if v := resp.Envs[harness.VisibleDevicesEnv]; v != n.uuid(2) {
			t.Errorf("%s = %q, want the GPU's UUID %s beside the channel", harness.VisibleDevicesEnv, v, n.uuid(2))
		}
		// Two containers on the node share the one channel, its node
		// made once.
		resp, err = n.e.Allocate(ctx(t), n.uuid(0), n.uuid(1))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(resp.Devices, func(d *api.DeviceSpec) bool { return d.ContainerPath == imexChannel0 && d.HostPath == host }) {
			t.Errorf("a second allocation lacks %s: %v", imexChannel0, resp.Devices)
		}
		given := 0
		for _, e := range n.p.LogEntries() {
			if e.String("msg") == "IMEX channel given to every GPU container" {
				given++
				if e.String("path") != host || e.String("major") != strconv.Itoa(int(major)) {
					t.Errorf("logged %v, want path %s and major %d", e, host, major)
				}
			}
		}
		if given != 1 {
			t.Errorf("the channel's readiness was logged %d times, want once", given)
		}
	})

	t.Run("gb200-tray cdi-cri: Allocate names the channel's CDI device, the GPU spec defines it", func(t *testing.T) {
		t.Parallel()
		needMknod(t)
		proc := procRoot(t, "gb200-tray")
		major := imexMajor(t, proc)
		specs := t.TempDir()
		n := startNodeWith(t, "gb200-tray", library, "--proc-root", proc, "--imex-channel-ids", "0", "--imex-required", "true",
			"--cdi-spec-dir", specs, "--device-list-strategy", "cdi-cri", "--cdi-hook-path", "")
		host := filepath.Join(n.p.DevRoot, imexChannelDir, "channel0")
		checkChannelNode(t, host, major)

		resp, err := n.e.Allocate(ctx(t), n.uuid(3))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, d := range resp.CdiDevices {
			names = append(names, d.Name)
		}
		want := []string{gpuCDIKind + "=" + n.uuid(3), imexCDIDevice}
		if !slices.Equal(slices.Sorted(slices.Values(names)), slices.Sorted(slices.Values(want))) {
			t.Fatalf("CDI devices = %v, want %v", names, want)
		}
		// The CDI library, as the runtime would, finds both names in the
		// spec on disk, and applies the channel device's own edits as the
		// device it is on the host. (InjectDevices would also apply the
		// spec's control nodes, plain files on a mock profile, and refuse.)
		cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(specs), cdiapi.WithAutoRefresh(false))
		if err != nil {
			t.Fatal(err)
		}
		if errs := cache.GetErrors(); len(errs) > 0 {
			t.Fatalf("the CDI library refused spec files: %v", errs)
		}
		for _, name := range names {
			if cache.GetDevice(name) == nil {
				t.Errorf("the spec on disk defines no %s (the cache knows %v)", name, cache.ListDevices())
			}
		}
		dev := cache.GetDevice(imexCDIDevice)
		if dev == nil {
			t.FailNow()
		}
		if nodes := dev.ContainerEdits.DeviceNodes; len(nodes) != 1 || nodes[0].Path != imexChannel0 || nodes[0].HostPath != host {
			t.Errorf("%s's nodes = %+v, want %s from %s", imexCDIDevice, nodes, imexChannel0, host)
		}
		spec := &oci.Spec{}
		if err := dev.ApplyEdits(spec); err != nil {
			t.Fatalf("applying %s: %v", imexCDIDevice, err)
		}
		var channel []oci.LinuxDevice
		if spec.Linux != nil {
			for _, d := range spec.Linux.Devices {
				if d.Path == imexChannel0 {
					channel = append(channel, d)
				}
			}
		}
		if len(channel) != 1 || channel[0].Type != "c" || channel[0].Major != int64(major) || channel[0].Minor != 0 {
			t.Errorf("the container's %s = %+v, want one character device %d:0", imexChannel0, channel, major)
		}
	})

	t.Run("dgx-h100 required: serve stops naming the reason and the fix, nothing served", func(t *testing.T) {
		t.Parallel()
		proc := procRoot(t, "dgx-h100")
		if _, ok := readIMEXMajor(t, proc); ok {
			t.Fatalf("profile dgx-h100 lists %s in %s/devices; this case needs a driver without IMEX", imexChannelDir, proc)
		}
		path, err := harness.ProfilePath("dgx-h100")
		if err != nil {
			t.Fatal(err)
		}
		dir, err := harness.ShortTempDir("gdp")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		logger, _ := ktesting.NewTestContext(t)
		k, err := harness.StartKubelet(dir, logger)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { k.Stop() })
		p, err := harness.StartPlugin(harness.PluginOptions{
			Binary: binary, Library: library, Profile: path, PluginDir: dir, HealthPollInterval: pollInterval,
			Args: []string{"--proc-root", proc, "--imex-channel-ids", "0", "--imex-required", "true"},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// It has exited on its own: Stop says so, and cleans up.
			_ = p.Stop()
			if t.Failed() {
				t.Logf("plugin log:\n%s", strings.TrimSpace(p.Log()))
			}
		})
		select {
		case <-p.Exited():
		case <-ctx(t).Done():
			t.Fatalf("the plugin still runs %v after start; want it stopped for want of the IMEX channel", waitTimeout)
		}
		var last string
		for line := range strings.Lines(strings.TrimSpace(p.Log())) {
			last = strings.TrimSpace(line)
		}
		for _, want := range []string{
			"gpu-device-plugin: ",
			"imex.required is true but IMEX channels [0] cannot be given to containers",
			filepath.Join(proc, "devices") + " lists no " + imexChannelDir + " character device: the driver has no IMEX support",
			"fix the driver (R550 or later, with IMEX support) or set imex.required to false",
		} {
			if !strings.Contains(last, want) {
				t.Errorf("last line of the plugin's output lacks %q:\n%s", want, last)
			}
		}
		if s := k.Stats(); len(s.Connects) != 0 {
			t.Errorf("the kubelet got %d registrations; want none: no GPU is served without the channel", len(s.Connects))
		}
		// Stop removes DevRoot; until then it is as the plugin left it.
		if _, err := os.Lstat(filepath.Join(p.DevRoot, imexChannelDir)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s under --dev-root: %v; want nothing made", imexChannelDir, err)
		}
	})

	t.Run("dgx-h100 not required: one warning, GPUs served without a channel", func(t *testing.T) {
		t.Parallel()
		proc := procRoot(t, "dgx-h100")
		n := startNodeWith(t, "dgx-h100", library, "--proc-root", proc, "--imex-channel-ids", "0")
		var warnings []harness.LogEntry
		for _, e := range n.p.LogEntries() {
			if e.String("level") == "WARN" && strings.Contains(strings.ToLower(e.String("msg")), "imex") {
				warnings = append(warnings, e)
			}
		}
		if len(warnings) != 1 || warnings[0].String("msg") != imexWarning ||
			!strings.Contains(warnings[0].String("reason"), "the driver has no IMEX support") {
			t.Errorf("IMEX warnings = %v, want one %q naming the missing driver support", warnings, imexWarning)
		}
		resp, err := n.e.Allocate(ctx(t), n.uuid(0), n.uuid(1))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range resp.Devices {
			if strings.Contains(d.ContainerPath, imexChannelDir) {
				t.Errorf("Allocate gives %s without a channel to give", d.ContainerPath)
			}
		}
		if v, ok := resp.Envs[imexEnv]; ok {
			t.Errorf("%s = %q without a channel", imexEnv, v)
		}
		if _, err := os.Lstat(filepath.Join(n.p.DevRoot, imexChannelDir)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s under --dev-root: %v; want nothing made without the driver's major", imexChannelDir, err)
		}
	})
}

// procRoot writes the profile's /proc (devices, MIG capabilities) into
// a temporary directory, for --proc-root.
func procRoot(t *testing.T, profile string) string {
	t.Helper()
	path, err := harness.ProfilePath(profile)
	if err != nil {
		t.Fatal(err)
	}
	prof, err := mocknvml.LoadProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	proc := t.TempDir()
	if err := prof.WriteProc(proc); err != nil {
		t.Fatal(err)
	}
	return proc
}

// imexMajor is the nvidia-caps-imex-channels major of proc/devices; the
// test fails without one.
func imexMajor(t *testing.T, proc string) uint32 {
	t.Helper()
	major, ok := readIMEXMajor(t, proc)
	if !ok {
		t.Fatalf("%s/devices lists no %s", proc, imexChannelDir)
	}
	return major
}

// readIMEXMajor reads the character device line "<major> nvidia-caps-imex-channels"
// of proc/devices.
func readIMEXMajor(t *testing.T, proc string) (uint32, bool) {
	t.Helper()
	f, err := os.Open(filepath.Join(proc, "devices"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line == "Block devices:" {
			break
		} else if num, name, ok := strings.Cut(line, " "); ok && strings.TrimSpace(name) == imexChannelDir {
			n, err := strconv.ParseUint(num, 10, 32)
			if err != nil {
				t.Fatalf("%s/devices: %q: %v", proc, line, err)
			}
			return uint32(n), true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return 0, false
}

// checkChannelNode checks that path is channel 0's node: a character
// device major:0, mode 0666.
func checkChannelNode(t *testing.T, path string, major uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatalf("IMEX channel node: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("%s mode %#o is not a character device", path, st.Mode)
	}
	if got, want := uint64(st.Rdev), unix.Mkdev(major, 0); got != want {
		t.Errorf("%s is %d:%d, want %d:0", path, unix.Major(got), unix.Minor(got), major)
	}
	if perm := st.Mode & 0o7777; perm != 0o666 {
		t.Errorf("%s mode %#o, want 0666", path, perm)
	}
}

// needMknod skips a case that makes a character device node when not
// root, except under CI.
func needMknod(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	const why = "root: the plugin makes the IMEX channel's character device with mknod"
	if os.Getenv("CI") != "" {
		t.Fatal("this case needs " + why + "; CI is set")
	}
	t.Skip("needs " + why)
}
