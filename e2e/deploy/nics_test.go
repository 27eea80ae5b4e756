package deploy

import (
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// devInfoDir is where Multus reads device-information files (the Network
// Plumbing WG device-info spec, section 4.1).
const devInfoDir = "/var/run/k8s.cni.cncf.io/devinfo/dp"

// renderWith renders the chart with vals over its defaults and decodes it.
func renderWith(t *testing.T, vals chartutil.Values) objects {
	t.Helper()
	c := loadChart(t)
	out, err := renderValues(t, c, vals)
	if err != nil {
		t.Fatalf("rendering the chart with %v: %v", vals, err)
	}
	names := make([]string, 0, len(out))
	for name := range out {
		if base := filepath.Base(name); !strings.HasPrefix(base, "_") && base != "NOTES.txt" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var stream strings.Builder
	for _, name := range names {
		stream.WriteString("---\n# Source: " + name + "\n" + out[name] + "\n")
	}
	objs, err := decodeStrict("chart with NIC pools", []byte(stream.String()))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// nicPoolValues declares the README's pools.
func nicPoolValues(t *testing.T) chartutil.Values {
	t.Helper()
	pools := readValues(t, repoPath(t, "internal", "config", "testdata", "example-nics.yaml"))
	if len(pools["nicResources"].([]any)) == 0 {
		t.Fatal("example-nics.yaml declares no pools")
	}
	return chartutil.Values{"config": map[string]any{"nicResources": pools["nicResources"]}}
}

// With NIC pools the plugin gets the host's view of the network (to find
// the management NIC by the default route) and the device-information
// directory at the path Multus reads; without them it gets neither.
func TestHelmNICPools(t *testing.T) {
	t.Run("pools configured", func(t *testing.T) {
		objs := renderWith(t, nicPoolValues(t))
		if errs := objs.validate(); len(errs) > 0 {
			t.Fatalf("the API server would reject the chart's objects:\n%v", errs.ToAggregate())
		}
		ds, cm := objs.DaemonSets[0], objs.ConfigMaps[0]
		spec := ds.Spec.Template.Spec
		if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
			t.Errorf("hostNetwork %v, dnsPolicy %q: want the host's network namespace, whose /proc/net/route has the default route",
				spec.HostNetwork, spec.DNSPolicy)
		}
		// /proc is then the host's network view, and procRoot must stay
		// /proc: <procRoot>/sys/kernel/random/boot_id keys the kept health.
		for _, a := range spec.Containers[0].Args {
			if strings.HasPrefix(a, "--proc-root") {
				t.Errorf("arg %q: with hostNetwork the default /proc is the host's view", a)
			}
		}
		checkDevInfoMount(t, ds, true)
		checkAcceptedByPlugin(t, ds, cm)
	})
	t.Run("no pools", func(t *testing.T) {
		objs := renderWith(t, chartutil.Values{})
		ds := objs.DaemonSets[0]
		if ds.Spec.Template.Spec.HostNetwork {
			t.Error("hostNetwork without NIC pools")
		}
		checkDevInfoMount(t, ds, false)
	})
	t.Run("an empty pool list is no pools", func(t *testing.T) {
		objs := renderWith(t, chartutil.Values{"config": map[string]any{"nicResources": []any{}}})
		if ds := objs.DaemonSets[0]; ds.Spec.Template.Spec.HostNetwork {
			t.Error("hostNetwork with nicResources: []")
		}
	})
}

func checkDevInfoMount(t *testing.T, ds *appsv1.DaemonSet, want bool) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	var mount *corev1.VolumeMount
	for i, m := range spec.Containers[0].VolumeMounts {
		if m.MountPath == devInfoDir {
			mount = &spec.Containers[0].VolumeMounts[i]
		}
	}
	if !want {
		if mount != nil {
			t.Errorf("%s mounted without NIC pools", devInfoDir)
		}
		return
	}
	if mount == nil {
		t.Fatalf("%s is not mounted: Allocate writes each NIC's device-information file there", devInfoDir)
	}
	if mount.ReadOnly {
		t.Errorf("%s mounted read-only", devInfoDir)
	}
	for _, v := range spec.Volumes {
		if v.Name != mount.Name {
			continue
		}
		hp := v.HostPath
		if hp == nil || hp.Path != devInfoDir || hp.Type == nil || *hp.Type != corev1.HostPathDirectoryOrCreate {
			t.Errorf("volume %s is %+v, want hostPath %s, DirectoryOrCreate", v.Name, v.VolumeSource, devInfoDir)
		}
		return
	}
	t.Errorf("no volume %s", mount.Name)
}
