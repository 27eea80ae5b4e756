package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// nicPool is a NIC resource from internal/config/testdata/example-nics.yaml: the
// RDMA NICs of one NUMA node.
func nicPool(numa int) corev1.ResourceName {
	return corev1.ResourceName(fmt.Sprintf("example.com/rdma_numa%d", numa))
}

// fixtureNIC is an RDMA NIC of the fixture's sysfs.
type fixtureNIC struct {
	Address string
	NUMA    int
	UVerbs  string // uverbsN
}

// fixtureNICs reads the fixture's RDMA NICs from its sysfs, as the
// plugin's pools select them (every one has infiniband_verbs).
func fixtureNICs() ([]fixtureNIC, error) {
	dirs, err := filepath.Glob(filepath.Join(env.Fixture, "sys", "bus", "pci", "devices", "*", "infiniband_verbs", "uverbs*"))
	if err != nil {
		return nil, err
	}
	var nics []fixtureNIC
	for _, d := range dirs {
		dev := filepath.Dir(filepath.Dir(d))
		b, err := os.ReadFile(filepath.Join(dev, "numa_node"))
		if err != nil {
			return nil, err
		}
		numa, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("%s: numa_node: %w", dev, err)
		}
		nics = append(nics, fixtureNIC{Address: filepath.Base(dev), NUMA: numa, UVerbs: filepath.Base(d)})
	}
	return nics, nil
}

func (s *scenario) nicPools(t *testing.T, ctx context.Context) {
	if !env.hasNICs() {
		t.Skip("the fixture has no NICs (e2e/cluster/fixture -nics)")
	}
	nics, err := fixtureNICs()
	if err != nil {
		t.Fatal(err)
	}
	want := map[corev1.ResourceName]int64{}
	for _, n := range nics {
		want[nicPool(n.NUMA)]++
	}
	var got map[corev1.ResourceName]int64
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = map[corev1.ResourceName]int64{}
		for r := range want {
			q := n.Status.Allocatable[r]
			got[r] = q.Value()
		}
		return fmt.Sprint(got) == fmt.Sprint(want), nil
	})
	if err != nil {
		t.Fatalf("node %s allocatable NICs %v, want %v: %v%s", env.Node, got, want, err, pluginLogs(ctx))
	}
	t.Logf("node %s: %v", env.Node, got)

	pool := nicPool(0)
	pod, err := createPod(ctx, probePodFor(podNIC, corev1.ResourceList{pool: *resource.NewQuantity(1, resource.DecimalSI)}), true)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := probeOutput(ctx, podNIC)
	if err != nil {
		t.Fatal(err)
	}
	envName := "PCIDEVICE_" + strings.NewReplacer(".", "_", "/", "_").Replace(strings.ToUpper(string(pool)))
	addr := rep.Env[envName]
	i := slices.IndexFunc(nics, func(n fixtureNIC) bool { return n.Address == addr })
	if i < 0 || nics[i].NUMA != 0 {
		t.Fatalf("%s=%q: not a NUMA 0 NIC of the fixture (env %v)", envName, addr, rep.Env)
	}
	var ib []string
	for _, p := range rep.devicePaths() {
		if strings.HasPrefix(p, "/dev/infiniband/") {
			ib = append(ib, p)
		}
	}
	if wantIB := []string{"/dev/infiniband/rdma_cm", "/dev/infiniband/" + nics[i].UVerbs}; !slices.Equal(ib, wantIB) {
		t.Errorf("pod %s has %v, want %v", podNIC, ib, wantIB)
	}
	checkDevInfoFile(t, pool, addr)
	q := pod.Status.ContainerStatuses[0].AllocatedResources[pool]
	t.Logf("pod %s: %s %s: %s=%s (NUMA %d), devices %v", podNIC, pool, q.String(), envName, addr, nics[i].NUMA, ib)
	if err := deletePods(ctx, podNIC); err != nil {
		t.Fatal(err)
	}
}

// checkDevInfoFile checks the device-information file Allocate wrote on
// the node for the NIC at addr, as Multus would read it: named as the
// Network Plumbing WG's device-info spec says (section 4.1), "pci" type,
// the NIC's PCI address.
func checkDevInfoFile(t *testing.T, pool corev1.ResourceName, addr string) {
	t.Helper()
	if env.DevInfoDir == "" {
		t.Log("E2E_DEVINFO_DIR is not set and the node's /var/run is not known: device-information file not checked")
		return
	}
	name := strings.ReplaceAll(string(pool), "/", "-") + "-" + addr + "-device.json"
	p := filepath.Join(env.DevInfoDir, name)
	data, err := os.ReadFile(p)
	if err != nil {
		entries, _ := os.ReadDir(env.DevInfoDir)
		t.Errorf("device-information file of %s: %v (directory holds %v)", addr, err, entries)
		return
	}
	var info struct {
		Type    string `json:"type"`
		Version string `json:"version"`
		PCI     struct {
			Address string `json:"pci-address"`
		} `json:"pci"`
	}
	if err := json.Unmarshal(data, &info); err != nil {
		t.Errorf("%s: %v\n%s", p, err, data)
		return
	}
	if info.Type != "pci" || info.Version != "1.1.0" || info.PCI.Address != addr {
		t.Errorf("%s holds %s, want type pci, version 1.1.0, pci-address %s", p, data, addr)
	}
	t.Logf("device information for Multus: %s", name)
}
