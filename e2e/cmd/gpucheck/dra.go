package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/harness"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/daemon/dramode"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/hw/nvml"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi/kubeapitest"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra"
)

const (
	draNode      = "gpu-check"
	draNamespace = "default"
	draRequest   = "gpu"
)

type draData struct {
	RegisteredMs float64       `json:"registeredMs"`
	PublishedMs  float64       `json:"publishedMs"`
	Devices      []string      `json:"devices"`
	Claimed      string        `json:"claimed"`
	PrepareMs    float64       `json:"prepareMs"`
	CDIDevices   []string      `json:"cdiDevices"`
	Container    *containerRun `json:"container,omitempty"`
	// Share is the memory share prepared after the whole GPU's claim.
	Share *draShareData `json:"share,omitempty"`
}

// dra runs the plugin's daemon in DRA mode in this process, publishing to
// a fake API server, with the kubelet's own DRA manager and plugin
// manager; the manager prepares a claim for one GPU, the probe runs on
// the CDI devices it got, and the claim is unprepared. The GPUs are
// published with consumable memory (sharing.memoryShares), and a claim for
// a quarter of one's memory is prepared next (draShare).
func (c *checker) dra(ctx context.Context, s *Step) {
	if c.served != nil {
		c.served.stop() // a node serves one kubelet API at a time
	}
	data := &draData{}
	s.Data = data
	dir := func(name string) string {
		p := filepath.Join(c.work, "dra", name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			s.fail("work folders", err)
		}
		return p
	}
	registry := dir("registry")
	k, err := harness.NewDRAKubelet(klog.Background(), registry, dir("kubelet"), draNode)
	if !s.check("kubelet's DRA manager starts", err == nil, "%s", errText(err)) {
		return
	}
	defer k.Stop()

	cfg := config.Default()
	cfg.KubeletAPI = config.KubeletAPIDRA
	cfg.NodeName = draNode
	cfg.PluginRegistryDir = registry
	cfg.DRAPluginDir = dir("plugin")
	cfg.DevicePluginDir = dir("device-plugins")
	cfg.CDISpecDir = dir("cdi")
	cfg.StateDir = dir("state")
	cfg.Remediation.Reset = false // never a reset on a shared GPU
	cfg.DeviceInfoDir = dir("devinfo")
	cfg.CDIHookPath = c.hook
	cfg.PodResourcesSocket = ""
	cfg.MetricsAddress = ""
	cfg.MPSRoot = dir("mps")
	cfg.Sharing.MemoryShares = config.MemoryShares{Enabled: true}
	for to, v := range map[*string]string{&cfg.DriverRoot: c.node.DriverRoot, &cfg.SysfsRoot: c.node.SysfsRoot, &cfg.DevRoot: c.node.DevRoot, &cfg.ProcRoot: c.node.ProcRoot} {
		if v != "" {
			*to = v
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	// The daemon reaches the fake API server over HTTP, as a real one.
	apiCfg, stopAPI := kubeapitest.Start(k.Client, nil, func(string, ...any) {})
	defer stopAPI()
	began := time.Now()
	go func() {
		done <- daemon.RunWith(runCtx, cfg, nvml.Open, c.logger(), dramode.With(dra.WithAPIConfig(apiCfg)))
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			s.check("daemon stops cleanly", err == nil || errors.Is(err, context.Canceled), "%s", errText(err))
		case <-time.After(waitTimeout):
			s.check("daemon stops cleanly", false, "still running %v after it was cancelled", waitTimeout)
		}
	}()

	_, err = k.AwaitRegistered(config.DRADriverName, 1)
	if !s.check("registers with the kubelet's plugin manager", err == nil, "%s", errText(err)) {
		return
	}
	data.RegisteredMs = harness.Millis(time.Since(began))
	slice, err := c.waitSlice(ctx, k)
	if !s.check("publishes a ResourceSlice", err == nil, "%s", errText(err)) {
		return
	}
	data.PublishedMs = harness.Millis(time.Since(began))
	var gpu *resourceapi.Device
	for i, d := range slice.Spec.Devices {
		data.Devices = append(data.Devices, d.Name)
		if a, ok := d.Attributes["type"]; ok && ptr.Deref(a.StringValue, "") == "gpu" && gpu == nil {
			gpu = &slice.Spec.Devices[i]
		}
	}
	if c.listed != nil {
		n := 0
		for _, g := range c.listed.GPUs {
			if !g.MIGEnabled {
				n++
			}
		}
		s.check("a device per whole GPU", countType(slice.Spec.Devices, "gpu") == n, "%d gpu devices, %d GPUs without MIG", countType(slice.Spec.Devices, "gpu"), n)
	}
	if !s.check("a GPU device to claim", gpu != nil, "devices %v", data.Devices) {
		return
	}
	data.Claimed = gpu.Name
	uuid := ptr.Deref(gpu.Attributes["uuid"].StringValue, "")

	pod, err := c.claim(ctx, k, "probe", resourceapi.DeviceRequestAllocationResult{Request: draRequest, Driver: config.DRADriverName, Pool: slice.Spec.Pool.Name, Device: gpu.Name})
	if !s.check("claim created", err == nil, "%s", errText(err)) {
		return
	}
	t := time.Now()
	err = k.Manager.PrepareResources(ctx, pod)
	data.PrepareMs = harness.Millis(time.Since(t))
	if !s.check("the kubelet's DRA manager prepares the claim", err == nil, "%s", errText(err)) {
		return
	}
	info, err := k.Manager.GetResources(pod, &pod.Spec.Containers[0])
	if !s.check("CDI devices for the container", err == nil && info != nil && len(info.CDIDevices) > 0, "%s", errText(err)) {
		return
	}
	for _, d := range info.CDIDevices {
		data.CDIDevices = append(data.CDIDevices, d.Name)
	}
	data.Container = c.runProbe(ctx, s, debian, cfg.CDISpecDir, []string{uuid}, data.CDIDevices)
	k.Remove(pod)
	err = k.Manager.UnprepareResources(ctx, pod)
	s.check("the claim is unprepared", err == nil, "%s", errText(err))
	data.Share = c.draShare(ctx, s, k, slice.Spec.Pool.Name, gpu, cfg.CDISpecDir, cfg.MPSRoot)
	s.Notes = draShareNotes(data.Share)
}

func countType(devs []resourceapi.Device, typ string) int {
	n := 0
	for _, d := range devs {
		if a, ok := d.Attributes["type"]; ok && ptr.Deref(a.StringValue, "") == typ {
			n++
		}
	}
	return n
}

// waitSlice polls the fake API server for our driver's slice on the node.
func (c *checker) waitSlice(ctx context.Context, k *harness.DRAKubelet) (*resourceapi.ResourceSlice, error) {
	deadline := time.Now().Add(waitTimeout)
	for {
		list, err := k.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for i, sl := range list.Items {
			if sl.Spec.Driver == config.DRADriverName && ptr.Deref(sl.Spec.NodeName, "") == draNode && len(sl.Spec.Devices) > 0 {
				return &list.Items[i], nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no ResourceSlice of %s for node %s within %v", config.DRADriverName, draNode, waitTimeout)
		}
		// The fake API server has no watch a poll could wait on here.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// claim creates a pod name with a ResourceClaim (name-gpu) allocated as
// r, as the scheduler would have left it, and counts the pod as running.
func (c *checker) claim(ctx context.Context, k *harness.DRAKubelet, name string, r resourceapi.DeviceRequestAllocationResult) (*v1.Pod, error) {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: draNamespace, UID: types.UID("pod-uid-" + name)},
		Spec: v1.PodSpec{
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name + "-gpu")}},
			Containers: []v1.Container{{
				Name:      "cuda",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
	req := resourceapi.ExactDeviceRequest{DeviceClassName: "gpu." + config.DRADriverName, Count: 1}
	if q, ok := r.ConsumedCapacity["memory"]; ok {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": q}}
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-gpu", Namespace: draNamespace, UID: types.UID("claim-uid-" + name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: draRequest, Exactly: &req}}}},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{r}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}},
		},
	}
	if _, err := k.Client.CoreV1().Pods(draNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := k.Client.ResourceV1().ResourceClaims(draNamespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	k.Run(pod)
	return pod, nil
}
