package suite

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// settings says where the node keeps what the suite checks. Paths are as
// this process sees them; the fixture is at the same path on the node.
type settings struct {
	// Fixture is the directory e2e/cluster/fixture wrote: the mock
	// library under driver/, the profile, sys/, dev/ and the control FIFO.
	Fixture string
	// DevicePluginDir is the node's /var/lib/kubelet/device-plugins.
	DevicePluginDir string
	// CDISpecDir is where the plugin writes CDI specs, as the node sees
	// it (the chart's cdiSpecDir; the runtime must read it), and CDIDir
	// is that directory as this process sees it.
	CDISpecDir string
	CDIDir     string
	// DevInfoDir is the node's /var/run/k8s.cni.cncf.io/devinfo/dp, where
	// the plugin writes each allocated NIC's device-information file, as
	// this process sees it: E2E_DEVINFO_DIR, or beside CDIDir when that is
	// the node's /var/run/cdi.
	DevInfoDir string
	// PluginImage and ProbeImage are on the node already (never pulled).
	PluginImage string
	// Helm is e2e/cmd/helminstall, which suite.sh builds.
	Helm       string
	ProbeImage string
	// KubeletRestart is a shell command that restarts the node's kubelet.
	KubeletRestart string
	// Node is the node's name.
	Node string
	// CDI says whether the container runtime injects CDI devices; the
	// cdi-cri pass is skipped without it.
	CDI bool
	// NodeAddress is where this process reaches the node's network (the
	// plugin's metrics port): E2E_NODE_ADDRESS, else 127.0.0.1, the local
	// cluster's node being this machine.
	NodeAddress string
	// NodeAPIServer is the API server's host:port as pods on the node's
	// network reach it, when that is not the address this process uses.
	NodeAPIServer string
	// ReportDir receives the pod statuses the suite records; may be empty.
	ReportDir string
	// Profile is the fixture's machine profile.
	Profile *mocknvml.Profile
	// NFDFeaturesDir is Node Feature Discovery's local feature folder on
	// the node (nfd-worker's features.d), at the same path for this
	// process: the chart's nodeLabels.nfdFeaturesDir. Empty: the chart's
	// default, on the node only.
	NFDFeaturesDir string
	// NFDManifests holds NFD's CRDs and RBAC (build.sh nfd), and
	// NFDMasterImage and NFDWorkerImage are on the node: the node-labels
	// lane deploys NFD from them. Empty: that lane skips.
	NFDManifests   string
	NFDMasterImage string
	NFDWorkerImage string
	// NVIDIAPluginImage and NVIDIAGFDImage are NVIDIA's device plugin
	// and GPU Feature Discovery (build.sh nvidia), on the node: the
	// migration lane deploys them. Empty: that lane skips.
	NVIDIAPluginImage string
	NVIDIAGFDImage    string
	// NFDSkip, when set, is why the node-labels lane does not run on this
	// cluster (kind.sh says so).
	NFDSkip string
	// PreviousImage is the previous release's image, on the node, and
	// PreviousChart its chart directory (build.sh previous: both from that
	// release's own tree); PreviousRelease names it. Empty: the upgrade
	// lane skips.
	PreviousImage   string
	PreviousChart   string
	PreviousRelease string
	// UpgradeSkip, when set, is why the upgrade lane does not run here.
	UpgradeSkip string
	// AuditLog is the API server's audit log, which records PluginUser,
	// the plugin's ServiceAccount; empty where the cluster keeps none.
	AuditLog   string
	PluginUser string
}

func loadSettings() (*settings, error) {
	s := &settings{
		Fixture:           os.Getenv("E2E_FIXTURE"),
		DevicePluginDir:   os.Getenv("E2E_DEVICE_PLUGIN_DIR"),
		CDISpecDir:        os.Getenv("E2E_CDI_SPEC_DIR"),
		CDIDir:            os.Getenv("E2E_CDI_DIR"),
		PluginImage:       os.Getenv("E2E_PLUGIN_IMAGE"),
		Helm:              os.Getenv("E2E_HELM"),
		ProbeImage:        os.Getenv("E2E_PROBE_IMAGE"),
		KubeletRestart:    os.Getenv("E2E_KUBELET_RESTART"),
		Node:              os.Getenv("E2E_NODE"),
		CDI:               os.Getenv("E2E_CDI") != "false",
		ReportDir:         os.Getenv("E2E_REPORT_DIR"),
		NodeAPIServer:     os.Getenv("E2E_NODE_API_SERVER"),
		NodeAddress:       os.Getenv("E2E_NODE_ADDRESS"),
		NFDFeaturesDir:    os.Getenv("E2E_NFD_FEATURES_DIR"),
		NFDManifests:      os.Getenv("E2E_NFD_MANIFESTS"),
		NFDMasterImage:    os.Getenv("E2E_NFD_MASTER_IMAGE"),
		NFDWorkerImage:    os.Getenv("E2E_NFD_WORKER_IMAGE"),
		NFDSkip:           os.Getenv("E2E_NFD_SKIP"),
		NVIDIAPluginImage: os.Getenv("E2E_NVIDIA_PLUGIN_IMAGE"),
		NVIDIAGFDImage:    os.Getenv("E2E_NVIDIA_GFD_IMAGE"),
		PreviousImage:     os.Getenv("E2E_PREVIOUS_IMAGE"),
		PreviousChart:     os.Getenv("E2E_PREVIOUS_CHART"),
		PreviousRelease:   os.Getenv("E2E_PREVIOUS_RELEASE"),
		UpgradeSkip:       os.Getenv("E2E_UPGRADE_SKIP"),
		AuditLog:          os.Getenv("E2E_AUDIT_LOG"),
		PluginUser:        os.Getenv("E2E_PLUGIN_USER"),
	}
	if s.NodeAddress == "" {
		s.NodeAddress = "127.0.0.1"
	}
	if s.CDISpecDir == "" {
		s.CDISpecDir = "/var/run/cdi"
	}
	s.DevInfoDir = os.Getenv("E2E_DEVINFO_DIR")
	if s.DevInfoDir == "" && s.CDIDir != "" && s.CDISpecDir == "/var/run/cdi" {
		s.DevInfoDir = filepath.Join(filepath.Dir(s.CDIDir), "k8s.cni.cncf.io", "devinfo", "dp")
	}
	var missing []string
	for name, v := range map[string]string{
		"E2E_DEVICE_PLUGIN_DIR": s.DevicePluginDir, "E2E_CDI_DIR": s.CDIDir,
		"E2E_PLUGIN_IMAGE": s.PluginImage, "E2E_PROBE_IMAGE": s.ProbeImage,
		"E2E_KUBELET_RESTART": s.KubeletRestart, "E2E_NODE": s.Node,
		"KUBECONFIG": os.Getenv("KUBECONFIG"),
	} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("E2E_FIXTURE is set but %s are not; run through make e2e-cluster or make e2e-kind", strings.Join(missing, ", "))
	}
	profiles, _ := filepath.Glob(filepath.Join(s.Fixture, "*.profile"))
	if len(profiles) != 1 {
		return nil, fmt.Errorf("%s: want one machine profile, found %d (run e2e/cluster/fixture)", s.Fixture, len(profiles))
	}
	p, err := mocknvml.LoadProfile(profiles[0])
	if err != nil {
		return nil, err
	}
	s.Profile = p
	return s, nil
}

// The paths inside the fixture, as e2e/cluster/fixture writes them.
func (s *settings) profilePath() string {
	return filepath.Join(s.Fixture, s.Profile.Name+".profile")
}
func (s *settings) driverRoot() string { return filepath.Join(s.Fixture, "driver") }
func (s *settings) procRoot() string   { return filepath.Join(s.Fixture, "proc") }

// hasNICs says whether the fixture has the NIC tree (fixture -nics).
func (s *settings) hasNICs() bool {
	_, err := os.Stat(filepath.Join(s.Fixture, "dev", "infiniband"))
	return err == nil
}
func (s *settings) controlFIFO() string { return filepath.Join(s.Fixture, "control") }
func (s *settings) nvmlLibrary() string {
	libs, _ := filepath.Glob(filepath.Join(s.driverRoot(), "usr", "lib", "*", mocknvml.LibraryName))
	if len(libs) == 0 {
		return filepath.Join(s.driverRoot(), "usr", "lib", "x86_64-linux-gnu", mocknvml.LibraryName)
	}
	return libs[0]
}

// uuidIndex maps each GPU's UUID, the plugin's device ID, to its index,
// which the mock's fault commands take.
func (s *settings) uuidIndex() map[string]int {
	m := map[string]int{}
	for _, g := range s.Profile.GPUs {
		m[g.UUID] = g.Index
	}
	return m
}

// clients reach the cluster named by KUBECONFIG.
type clients struct {
	config  *rest.Config
	kube    kubernetes.Interface
	dynamic dynamic.Interface
}

func newClients() (*clients, error) {
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading KUBECONFIG: %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &clients{config: cfg, kube: kube, dynamic: dyn}, nil
}

var (
	env *settings
	k8s *clients
)

func TestMain(m *testing.M) {
	if os.Getenv("E2E_FIXTURE") == "" {
		fmt.Println("suite: skipped: E2E_FIXTURE is not set (run make e2e-cluster or make e2e-kind)")
		os.Exit(0)
	}
	var err error
	if env, err = loadSettings(); err == nil {
		k8s, err = newClients()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "suite:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
