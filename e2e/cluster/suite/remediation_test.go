package suite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/cluster/auditlog"
	"github.com/gpu-device-plugin/gpu-device-plugin/e2e/mocknvml"
)

// The remediation lanes: the driver asks for a reset of the GPU one
// Deployment's pod holds while every other GPU of the node is held by a
// pod of its own. The plugin withholds that GPU; its pod goes (evicted by
// the device taint in DRA mode; deleted, as an operator would, in
// device-plugin mode, which evicts nothing); the plugin resets the GPU
// through the mock NVML, proves it with the CUDA probe and offers it
// again; the Deployment's new pod, pending until then, gets it. The other
// pods and their GPUs are never touched.

const (
	remVictim   = "rem-victim" // the Deployment whose pod holds the faulted GPU
	remTemplate = "rem-one-gpu"
	// remUsagePoll is how often the plugin looks at a withheld GPU's pods.
	remUsagePoll = "1s"
)

// remBystanders are the pods on every other GPU.
func remBystanders(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("rem-bystander-%d", i))
	}
	return out
}

// healthRulesOnly turns the remediation, on by default, off in values:
// for the lanes that test health's own rules with XID 79 and a reset the
// driver reports (a recovery action, then none), after which health lets
// the GPU back. The remediation keeps a GPU that fell off the bus out until
// the node reboots or a person releases it.
func healthRulesOnly(values map[string]any) {
	values["config"].(map[string]any)["remediation"] = map[string]any{"enabled": false}
}

// remediationValues turn the remediation on in values, evicting (DRA mode
// only) at once.
func remediationValues(values map[string]any, evict bool) {
	r := map[string]any{"enabled": true, "usagePoll": remUsagePoll}
	if evict {
		r["evict"] = true
		r["gracePeriod"] = "0s"
	}
	values["config"].(map[string]any)["remediation"] = r
	// The Events say what happened and how long it took.
	values["events"] = map[string]any{"enabled": true}
}

// remLane is one remediation lane's node and what it measured.
type remLane struct {
	mode    string // "dra" or "device-plugin"
	release *release
	plugin  string
	// pod makes a pod holding one GPU; gpuOf says which GPU a pod holds,
	// by index.
	pod   func(name string) *corev1.Pod
	gpuOf func(ctx context.Context, p *corev1.Pod) (int, error)
	// bystanders are the other pods, by name, with their UIDs and GPUs.
	bystanders map[string]bystander
	// bootID is the node's boot ID file the plugin reads.
	bootID string
}

type bystander struct {
	uid string
	gpu int
}

func TestRemediationDRA(t *testing.T) {
	ctx := t.Context()
	values, err := draValues()
	if err != nil {
		t.Fatal(err)
	}
	remediationValues(values, true)
	l := &remLane{mode: "dra"}
	l.pod = func(name string) *corev1.Pod { return claimProbePod(name, remTemplate) }
	l.gpuOf = func(ctx context.Context, p *corev1.Pod) (int, error) {
		claims, err := podClaims(ctx, p)
		if err != nil {
			return 0, err
		}
		devs := ourDevices(claims)
		if len(devs) != 1 {
			return 0, fmt.Errorf("pod %s holds %v, want one GPU", p.Name, devs)
		}
		var i int
		if _, err := fmt.Sscanf(devs[0], "gpu-%d", &i); err != nil {
			return 0, fmt.Errorf("pod %s holds %q, not a GPU", p.Name, devs[0])
		}
		return i, nil
	}
	l.cleanUp(t)
	removeRemediationState()
	l.release = installDRA(t, ctx, values, remBystanders(len(env.Profile.GPUs))...)
	if err := createTemplate(ctx, remTemplate, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuClass, Count: 1},
	}}}); err != nil {
		t.Fatal(err)
	}
	l.run(t, ctx)
	if t.Failed() {
		return
	}
	deleteVictim(ctx)
	if err := deletePods(ctx, remBystanders(len(env.Profile.GPUs))...); err != nil {
		t.Fatal(err)
	}
	uninstallDRA(t, ctx, l.release, remTemplate)
	l.release = nil
	removeRemediationState()
}

func TestRemediationDevicePlugin(t *testing.T) {
	ctx := t.Context()
	values, err := chartValues("envvar")
	if err != nil {
		t.Fatal(err)
	}
	remediationValues(values, false)
	// The chart's own value: it adds the RBAC and the admission policy.
	values["remediation"] = map[string]any{"cordon": true}
	l := &remLane{mode: "device-plugin"}
	l.pod = func(name string) *corev1.Pod { return probePod(name, 1) }
	l.gpuOf = func(ctx context.Context, p *corev1.Pod) (int, error) {
		held := sortedKeys(allocatedGPUs(p))
		if len(held) != 1 {
			return 0, fmt.Errorf("pod %s holds %v, want one GPU", p.Name, held)
		}
		i, ok := env.uuidIndex()[held[0]]
		if !ok {
			return 0, fmt.Errorf("pod %s holds %q, which the profile lacks", p.Name, held[0])
		}
		return i, nil
	}
	l.cleanUp(t)
	removeRemediationState()
	if err := prepareNode(ctx); err != nil {
		t.Fatal(err)
	}
	if err := deletePods(ctx, remBystanders(len(env.Profile.GPUs))...); err != nil {
		t.Fatal(err)
	}
	r, err := renderValues(values)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.apply(ctx); err != nil {
		t.Fatal(err)
	}
	l.release = r
	l.run(t, ctx)
	if t.Failed() {
		return
	}
	l.rebootCordons(t, ctx)
	if t.Failed() {
		return
	}
	deleteVictim(ctx)
	if err := deletePods(ctx, remBystanders(len(env.Profile.GPUs))...); err != nil {
		t.Fatal(err)
	}
	if err := l.release.uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	l.release = nil
	if err := removeSpecs(); err != nil {
		t.Fatal(err)
	}
	removeRemediationState()
}

// cleanUp leaves the node clean for the next lane when t fails. It gives
// the node a boot ID where the plugin reads it, as a real node has, so the
// remediation's state is kept.
func (l *remLane) cleanUp(t *testing.T) {
	bootID, err := fixtureBootID()
	if err != nil {
		t.Fatal(err)
	}
	l.bootID = bootID
	t.Cleanup(func() { os.Remove(bootID) })
	cleanUpOnFailure(t, func() *release { return l.release }, true, remBystanders(len(env.Profile.GPUs))...)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		deleteVictim(ctx)
		k8s.kube.ResourceV1().ResourceClaimTemplates(testNamespace).Delete(ctx, remTemplate, metav1.DeleteOptions{})
		removeRemediationState()
	})
}

// removeRemediationState removes the plugin's remediation and health
// state from the node, as a reboot would make them stale: no later lane
// starts with a GPU this one faulted.
func removeRemediationState() {
	os.Remove(remediationStateFile())
	os.Remove(healthStateFile())
}

// remediationStateFile is the plugin's remediation.json as the node sees
// it, beside healthStateFile.
func remediationStateFile() string {
	return filepath.Join(filepath.Dir(healthStateFile()), "remediation.json")
}

func (l *remLane) run(t *testing.T, ctx context.Context) {
	var err error
	if l.plugin, err = waitPluginRunning(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitPluginReady(ctx, l.plugin); err != nil {
		t.Fatal(err)
	}

	// Every GPU but one to a bystander, the last to the Deployment's pod.
	n := len(env.Profile.GPUs)
	names := remBystanders(n - 1)
	for _, name := range names {
		if _, err := createPod(ctx, l.pod(name), false); err != nil {
			t.Fatal(err)
		}
	}
	l.bystanders = map[string]bystander{}
	for _, name := range names {
		p, err := waitRunning(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		g, err := l.gpuOf(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		l.bystanders[name] = bystander{uid: string(p.UID), gpu: g}
	}
	if err := createVictim(ctx, l.pod("")); err != nil {
		t.Fatal(err)
	}
	victim, err := waitVictim(ctx, "", "running", isRunning)
	if err != nil {
		t.Fatal(err)
	}
	sick, err := l.gpuOf(ctx, victim)
	if err != nil {
		t.Fatal(err)
	}
	uuid := env.Profile.GPUs[sick].UUID
	t.Logf("%s: pod %s holds GPU %d; %d bystanders hold the others", l.mode, victim.Name, sick, len(l.bystanders))

	others := l.watchOthers(ctx, sick)
	audit := &auditlog.Tail{Path: env.AuditLog, User: env.PluginUser}
	if env.AuditLog != "" {
		if err := audit.Mark(); err != nil {
			t.Fatal(err)
		}
	}
	ctl, err := mocknvml.OpenControl(env.controlFIFO())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	fault := time.Now()
	if err := ctl.InjectContext(ctx, fmt.Sprintf("recovery %d reset", sick)); err != nil {
		t.Fatal(err)
	}

	// Withheld: in DRA mode the device's taint evicts; in device-plugin
	// mode the kubelet tells the pod.
	var withheld, gone time.Time
	if l.mode == "dra" {
		if _, err := waitSlices(ctx, fmt.Sprintf("evicting from gpu-%d", sick), func(d map[string]resourceapi.Device) bool {
			return slices.ContainsFunc(d[fmt.Sprintf("gpu-%d", sick)].Taints, func(tt resourceapi.DeviceTaint) bool {
				return tt.Effect == resourceapi.DeviceTaintEffectNoExecute
			})
		}); err != nil {
			t.Fatal(err)
		}
		withheld = time.Now()
		if err := waitGone(ctx, victim.Name, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		gone = time.Now()
	} else {
		if _, err := waitPod(ctx, victim.Name, time.Minute, "told its GPU is unhealthy", func(p *corev1.Pod) (bool, error) {
			return allocatedGPUs(p)[uuid] == corev1.ResourceHealthStatusUnhealthy, nil
		}); err != nil {
			t.Fatal(err)
		}
		withheld = time.Now()
		// No eviction in this mode (docs/security.md): the GPU waits for
		// its pod, which an operator, told by the pod's status, deletes.
		if n := l.transitionsTo(ctx, uuid, "resetting"); n != 0 {
			t.Fatalf("GPU %d reset while its pod ran", sick)
		}
		if err := deletePods(ctx, victim.Name); err != nil {
			t.Fatal(err)
		}
		gone = time.Now()
	}

	// The Deployment's new pod waits for a GPU; it gets the one given back.
	// In device-plugin mode the scheduler may place a pod by the node's
	// allocatable from before the fault, which the kubelet then rejects
	// (UnexpectedAdmissionError); the Deployment makes another.
	offered, err := l.waitOffered(ctx, sick)
	if err != nil {
		t.Fatal(err)
	}
	next, err := waitVictim(ctx, victim.Name, "running", isRunning)
	if err != nil {
		t.Fatal(err)
	}
	running := time.Now()
	if rejected := l.rejected(ctx); rejected > 0 {
		t.Logf("the kubelet rejected %d pods of the Deployment while the GPU was out (the scheduler's view of the node lags)", rejected)
	}
	if g, err := l.gpuOf(ctx, next); err != nil || g != sick {
		t.Errorf("the Deployment's new pod %s holds GPU %d (%v), want GPU %d, given back", next.Name, g, err, sick)
	}
	if violations := others(); len(violations) > 0 {
		t.Errorf("other GPUs were touched during the remediation:\n%s", strings.Join(violations, "\n"))
	}
	l.checkBystanders(t, ctx)

	// The plugin's own account: GPU sick went through a reset, no other
	// GPU changed state, and the node heard of it.
	steps := l.transitions(ctx)
	var got []string
	for _, s := range steps {
		if s.gpu != uuid {
			t.Errorf("GPU %s went %s -> %s; only GPU %d was faulted", s.gpu, s.from, s.to, sick)
			continue
		}
		got = append(got, s.to)
	}
	if !isSubsequence([]string{"draining", "resetting", "probing", "serving"}, got) || slices.Contains(got, "needsHuman") || slices.Contains(got, "needsReboot") {
		t.Errorf("GPU %d went serving -> %v, want through draining, resetting and probing back to serving", sick, got)
	}
	if err := waitNodeEvent(ctx, "GPUGivenBack"); err != nil {
		t.Error(err)
	}

	t.Logf("%s figures (mock NVML, usage poll %s):", l.mode, remUsagePoll)
	t.Logf("  fault -> withheld (%s): %s", map[string]string{"dra": "the device taint NoExecute", "device-plugin": "the pod's status Unhealthy"}[l.mode], withheld.Sub(fault).Round(time.Millisecond))
	t.Logf("  withheld -> pod gone (%s): %s", map[string]string{"dra": "evicted by the taint", "device-plugin": "deleted by the lane"}[l.mode], gone.Sub(withheld).Round(time.Millisecond))
	rec := map[string]any{"step": "remediation", "mode": l.mode, "gpu": sick,
		"faultToWithheld":   withheld.Sub(fault).Round(time.Millisecond).String(),
		"withheldToPodGone": gone.Sub(withheld).Round(time.Millisecond).String()}
	reset, okReset := stepTime(steps, uuid, "resetting")
	back, okBack := stepTime(steps, uuid, "serving")
	if okReset && okBack {
		t.Logf("  fault -> reset started (the plugin's log): %s", reset.Sub(fault).Round(time.Millisecond))
		t.Logf("  reset started -> given back, proven by the probe (the plugin's log): %s", back.Sub(reset).Round(time.Millisecond))
		rec["faultToReset"] = reset.Sub(fault).Round(time.Millisecond).String()
		rec["resetToGivenBack"] = back.Sub(reset).Round(time.Millisecond).String()
	}
	// The kubelet's allocatable lags the plugin (the node status is sent
	// every few seconds): in device-plugin mode it may never have shown
	// the GPU missing, so only DRA's taint makes a figure.
	if l.mode == "dra" {
		t.Logf("  pod gone -> offered again (the taint gone): %s", offered.Sub(gone).Round(time.Millisecond))
		rec["podGoneToOffered"] = offered.Sub(gone).Round(time.Millisecond).String()
	}
	t.Logf("  offered again -> the Deployment's new pod running on it: %s", running.Sub(offered).Round(time.Millisecond))
	rec["offeredToRunning"] = running.Sub(offered).Round(time.Millisecond).String()
	if env.AuditLog != "" {
		reqs, err := audit.Read()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("  the plugin's requests to the API server, fault to the new pod running (%s): %s", running.Sub(fault).Round(time.Millisecond), auditlog.Summary(reqs))
		rec["apiRequests"] = len(reqs)
		rec["apiRequestsByKind"] = auditlog.Count(reqs)
	}
	events := gpuEvents(ctx, fault)
	t.Logf("  Events since the fault: %v", events)
	rec["events"] = events
	recordRemediation(rec)
}

// rejected counts the Deployment's pods the kubelet refused to admit.
func (l *remLane) rejected(ctx context.Context) int {
	pods, err := k8s.kube.CoreV1().Pods(testNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + remVictim})
	if err != nil {
		return 0
	}
	n := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodFailed {
			n++
		}
	}
	return n
}

// cordonAnnotation marks a cordon the plugin made (the chart's
// gpu-device-plugin.cordonAnnotation).
const cordonAnnotation = "gpu-device-plugin.github.io/cordoned"

// rebootCordons: the driver asks for a node reboot for one GPU. The plugin,
// allowed to (the chart's remediation.cordon), cordons its Node through the
// API server and the admission policy; after the reboot (a new boot ID and
// the plugin started again) it lifts its own cordon.
func (l *remLane) rebootCordons(t *testing.T, ctx context.Context) {
	t.Cleanup(func() {
		if t.Failed() {
			// As an operator would, so the next lanes can schedule.
			uncordon(context.Background())
		}
	})
	ctl, err := mocknvml.OpenControl(env.controlFIFO())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	sick := l.bystanders[remBystanders(1)[0]].gpu
	fault := time.Now()
	if err := ctl.InjectContext(ctx, fmt.Sprintf("recovery %d reboot", sick)); err != nil {
		t.Fatal(err)
	}
	n, err := waitNode(ctx, "cordoned by the plugin", func(n *corev1.Node) bool {
		return n.Spec.Unschedulable && n.Annotations[cordonAnnotation] != ""
	})
	if err != nil {
		t.Fatal(err)
	}
	cordoned := time.Now()
	t.Logf("GPU %d needs a reboot: node cordoned %s after the fault, annotation %q", sick, cordoned.Sub(fault).Round(time.Millisecond), n.Annotations[cordonAnnotation])
	if err := waitNodeEvent(ctx, "NodeCordoned"); err != nil {
		t.Error(err)
	}

	// The reboot: another boot ID, and the plugin started again (a fresh
	// mock NVML, whose GPUs ask for nothing).
	if err := os.WriteFile(l.bootID, []byte("00000000-0000-4000-8000-00000000b007\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := l.plugin
	rebooted := time.Now()
	if err := k8s.kube.CoreV1().Pods(releaseNamespace).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if l.plugin, err = waitPluginRunning(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := waitNode(ctx, "uncordoned by the plugin", func(n *corev1.Node) bool {
		return !n.Spec.Unschedulable && n.Annotations[cordonAnnotation] == ""
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the reboot the plugin lifted its cordon %s after its old pod was deleted", time.Since(rebooted).Round(time.Millisecond))
	if err := waitNodeEvent(ctx, "NodeUncordoned"); err != nil {
		t.Error(err)
	}
}

// waitNode polls the node until ok holds.
func waitNode(ctx context.Context, what string, ok func(*corev1.Node) bool) (*corev1.Node, error) {
	var last *corev1.Node
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n
		return ok(n), nil
	})
	if err != nil {
		var state string
		if last != nil {
			state = fmt.Sprintf(" (unschedulable %t, annotation %q)", last.Spec.Unschedulable, last.Annotations[cordonAnnotation])
		}
		return last, fmt.Errorf("node %s not %s%s: %w%s", env.Node, what, state, err, pluginLogs(ctx))
	}
	return last, nil
}

// uncordon makes the node schedulable and drops the plugin's mark.
func uncordon(ctx context.Context) {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":false},"metadata":{"annotations":{%q:null}}}`, cordonAnnotation)
	k8s.kube.CoreV1().Nodes().Patch(ctx, env.Node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
}

// isRunning says whether every container of p runs.
func isRunning(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil {
			return false
		}
	}
	return true
}

// isSubsequence says whether want appears in got in order.
func isSubsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// createVictim makes the Deployment of one pod like p.
func createVictim(ctx context.Context, p *corev1.Pod) error {
	one := int32(1)
	labels := map[string]string{"app": remVictim}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: remVictim, Namespace: testNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: p.Spec},
		},
	}
	if _, err := k8s.kube.AppsV1().Deployments(testNamespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Deployment %s: %w", remVictim, err)
	}
	return nil
}

// deleteVictim deletes the Deployment and waits for its pods to go.
func deleteVictim(ctx context.Context) {
	fg := metav1.DeletePropagationForeground
	k8s.kube.AppsV1().Deployments(testNamespace).Delete(ctx, remVictim, metav1.DeleteOptions{PropagationPolicy: &fg})
	wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := k8s.kube.CoreV1().Pods(testNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + remVictim})
		return err == nil && len(l.Items) == 0, nil
	})
}

// waitVictim waits for a pod of the Deployment, other than old, for which
// ok holds.
func waitVictim(ctx context.Context, old, what string, ok func(*corev1.Pod) bool) (*corev1.Pod, error) {
	var found *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := k8s.kube.CoreV1().Pods(testNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + remVictim})
		if err != nil {
			return false, nil
		}
		for i := range l.Items {
			p := &l.Items[i]
			if p.Name != old && p.DeletionTimestamp == nil && ok(p) {
				found = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no pod of Deployment %s %s: %w", remVictim, what, err)
	}
	return found, nil
}

// waitGone waits until pod name no longer exists.
func waitGone(ctx context.Context, name string, timeout time.Duration) error {
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		last = p
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("pod %s not gone: %w%s", name, err, describePod(ctx, last))
	}
	return nil
}

// waitOffered waits until GPU i is offered again: no taint on its device
// (DRA), the node's allocatable whole (device plugin).
func (l *remLane) waitOffered(ctx context.Context, i int) (time.Time, error) {
	if l.mode == "dra" {
		_, err := waitSlices(ctx, fmt.Sprintf("offering gpu-%d again", i), func(d map[string]resourceapi.Device) bool {
			dev, ok := d[fmt.Sprintf("gpu-%d", i)]
			return ok && len(dev.Taints) == 0
		})
		return time.Now(), err
	}
	want := int64(len(env.Profile.GPUs))
	var have string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := k8s.kube.CoreV1().Nodes().Get(ctx, env.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		q := n.Status.Allocatable[gpuResource]
		have = q.String()
		return q.Value() == want, nil
	})
	if err != nil {
		return time.Now(), fmt.Errorf("node allocatable %s is %s, want %d: %w%s", gpuResource, have, want, err, pluginLogs(ctx))
	}
	return time.Now(), nil
}

// watchOthers watches every GPU but sick until the returned function is
// called, which returns what it saw them go through: a taint (DRA), or a
// bystander's GPU not Healthy in its pod's status.
func (l *remLane) watchOthers(ctx context.Context, sick int) func() []string {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	seen := map[string]bool{}
	var out []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			if l.mode == "dra" {
				if _, devs, err := nodeSlices(ctx); err == nil {
					for name, d := range devs {
						if strings.HasPrefix(name, "gpu-") && name != fmt.Sprintf("gpu-%d", sick) && len(d.Taints) > 0 {
							note(fmt.Sprintf("%s tainted %+v", name, d.Taints))
						}
					}
				}
			}
			for name := range l.bystanders {
				if p, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{}); err == nil {
					h := allocatedGPUs(p)
					if l.mode == "dra" {
						h = map[string]corev1.ResourceHealthStatus{}
						for id, rh := range claimHealth(p) {
							h[id] = rh.Health
						}
					}
					for id, st := range h {
						if st != corev1.ResourceHealthStatusHealthy {
							note(fmt.Sprintf("pod %s: %s %s", name, id, st))
						}
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() []string {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return out
	}
}

// checkBystanders checks that every bystander is the pod it was, running,
// never restarted, on the GPU it had.
func (l *remLane) checkBystanders(t *testing.T, ctx context.Context) {
	t.Helper()
	for name, b := range l.bystanders {
		p, err := k8s.kube.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("bystander %s: %v", name, err)
			continue
		}
		if string(p.UID) != b.uid || !isRunning(p) {
			t.Errorf("bystander %s: uid %s (was %s), phase %s: want the same pod, running", name, p.UID, b.uid, p.Status.Phase)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount != 0 {
				t.Errorf("bystander %s: container %s restarted %d times", name, cs.Name, cs.RestartCount)
			}
		}
		if g, err := l.gpuOf(ctx, p); err != nil || g != b.gpu {
			t.Errorf("bystander %s holds GPU %d (%v), want GPU %d", name, g, err, b.gpu)
		}
	}
}

// remStep is one remediation transition of the plugin's log.
type remStep struct {
	gpu, from, to string
	at            time.Time
}

// transitions are the remediation transitions the plugin logged.
func (l *remLane) transitions(ctx context.Context) []remStep {
	var out []remStep
	for _, e := range pluginLogLines(ctx, l.plugin, "remediation") {
		s := remStep{}
		s.gpu, _ = e["gpu"].(string)
		s.from, _ = e["from"].(string)
		s.to, _ = e["to"].(string)
		if ts, ok := e["time"].(string); ok {
			s.at, _ = time.Parse(time.RFC3339Nano, ts)
		}
		if s.to != "" {
			out = append(out, s)
		}
	}
	return out
}

// transitionsTo counts the GPU's logged transitions to state.
func (l *remLane) transitionsTo(ctx context.Context, gpu, state string) int {
	n := 0
	for _, s := range l.transitions(ctx) {
		if s.gpu == gpu && s.to == state {
			n++
		}
	}
	return n
}

// stepTime is when the GPU first went to state, by the plugin's log.
func stepTime(steps []remStep, gpu, state string) (time.Time, bool) {
	for _, s := range steps {
		if s.gpu == gpu && s.to == state && !s.at.IsZero() {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// waitNodeEvent waits for an Event of reason on the node.
func waitNodeEvent(ctx context.Context, reason string) error {
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := k8s.kube.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + env.Node + ",reason=" + reason,
		})
		return err == nil && len(l.Items) > 0, nil
	})
	if err != nil {
		return fmt.Errorf("no %s Event on node %s: %w", reason, env.Node, err)
	}
	return nil
}

// gpuEvents counts the GPU Events made since from, on the node and the
// lane's pods, by "reason kind".
func gpuEvents(ctx context.Context, from time.Time) map[string]int {
	out := map[string]int{}
	l, err := k8s.kube.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return out
	}
	for _, e := range l.Items {
		at := e.LastTimestamp.Time
		if at.IsZero() {
			at = e.EventTime.Time
		}
		if !strings.HasPrefix(e.Reason, "GPU") || at.Add(time.Second).Before(from) {
			continue
		}
		out[e.Reason+" "+e.InvolvedObject.Kind] += int(max(e.Count, 1))
	}
	return out
}

// recordRemediation appends the lane's figures to the report.
func recordRemediation(rec map[string]any) {
	if env.ReportDir == "" {
		return
	}
	b, err := json.Marshal(rec)
	if err != nil || os.MkdirAll(env.ReportDir, 0o755) != nil {
		return
	}
	f, err := os.OpenFile(filepath.Join(env.ReportDir, "remediation.jsonl"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	f.Write(append(b, '\n'))
}
