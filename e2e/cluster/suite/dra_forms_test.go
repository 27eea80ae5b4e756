package suite

import (
	"context"
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The claim-forms lane: a prioritized list (firstAvailable) served by the
// choice that fits, and an admin-access claim prepared for a GPU another
// claim holds.
const (
	listTmpl   = "gpu-first-available"
	adminTmpl  = "gpu-admin"
	podListed  = "dra-first-available"
	podAdmin   = "dra-admin"
	adminLabel = "resource.kubernetes.io/admin-access"
)

var formPods = []string{podListed, podAdmin}

// TestDRAClaimForms: a claim whose request asks first for more GPUs than
// the node has, else one, gets one by its second choice and runs on it;
// a monitoring pod's admin-access claim for that same GPU is prepared
// beside it, sees the GPU, and does not take it from the first claim.
func TestDRAClaimForms(t *testing.T) {
	s := &formsScenario{}
	steps := []step{
		{"install in DRA mode", s.install},
		{"a prioritized list is served by the choice that fits", s.prioritized},
		{"an admin-access claim is prepared for a GPU another claim holds", s.admin},
		{"uninstall leaves the node clean", s.uninstall},
	}
	cleanUpOnFailure(t, func() *release { return s.release }, true, formPods...)
	runSteps(t, t.Context(), steps)
}

type formsScenario struct {
	release *release
	// held is the GPU (gpu-N) the prioritized-list claim got, its UUID
	// and the claim's UID.
	held, heldUUID string
	claim          types.UID
}

func (s *formsScenario) install(t *testing.T, ctx context.Context) {
	v, err := draValues()
	if err != nil {
		t.Fatal(err)
	}
	s.release = installDRA(t, ctx, v, formPods...)
	if _, err := waitPluginRunning(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := waitSlices(ctx, "publishing the GPUs", func(d map[string]resourceapi.Device) bool { _, ok := d["gpu-0"]; return ok }); err != nil {
		t.Fatal(err)
	}
}

func (s *formsScenario) prioritized(t *testing.T, ctx context.Context) {
	all := int64(len(env.Profile.GPUs))
	if err := createTemplate(ctx, listTmpl, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu",
		FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "more", DeviceClassName: gpuClass, Count: all + 1}, // more than the node has
			{Name: "one", DeviceClassName: gpuClass, Count: 1},
		},
	}}}); err != nil {
		t.Fatal(err)
	}
	pod, err := createPod(ctx, claimProbePod(podListed, listTmpl), true)
	if err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	claims, err := podClaims(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if len(claims) != 1 || claims[0].Status.Allocation == nil || len(claims[0].Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claims %+v", claims)
	}
	r := claims[0].Status.Allocation.Devices.Results[0]
	if r.Request != "gpu/one" {
		t.Errorf("allocated for request %q, want the second choice gpu/one", r.Request)
	}
	s.held, s.heldUUID, s.claim = r.Device, uuidOf(r.Device), claims[0].UID
	rep, err := probeOutput(ctx, podListed)
	if err != nil {
		t.Fatal(err)
	}
	checkGPUDevices(t, rep, []string{s.heldUUID})
	t.Logf("request gpu served by %s with %s", r.Request, r.Device)
}

func (s *formsScenario) admin(t *testing.T, ctx context.Context) {
	// Admin access is for namespaces an administrator marked so.
	if err := labelNamespace(ctx, testNamespace, adminLabel, "true"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := labelNamespace(ctx, testNamespace, adminLabel, ""); err != nil {
			t.Error(err)
		}
	}()
	if err := createTemplate(ctx, adminTmpl, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: gpuClass, AdminAccess: new(true),
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes[%q].uuid == %q`, draDriver, s.heldUUID),
			}}},
		},
	}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := createPod(ctx, claimProbePod(podAdmin, adminTmpl), true); err != nil {
		t.Fatalf("%v%s", err, pluginLogs(ctx))
	}
	rep, err := probeOutput(ctx, podAdmin)
	if err != nil {
		t.Fatal(err)
	}
	checkGPUDevices(t, rep, []string{s.heldUUID})
	// The first claim still holds the GPU: both are prepared.
	left, err := checkpointClaims()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 {
		t.Errorf("checkpoint holds %v, want the prioritized-list claim and the admin one", left)
	}
	if err := deletePods(ctx, formPods...); err != nil {
		t.Fatal(err)
	}
}

func (s *formsScenario) uninstall(t *testing.T, ctx context.Context) {
	uninstallDRA(t, ctx, s.release, listTmpl, adminTmpl)
	s.release = nil
}

// labelNamespace sets (or, with value "", removes) a label of namespace.
func labelNamespace(ctx context.Context, namespace, key, value string) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, value)
	if value == "" {
		patch = fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, key)
	}
	_, err := k8s.kube.CoreV1().Namespaces().Patch(ctx, namespace, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}
