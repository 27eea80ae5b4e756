package cordon

import (
	"context"
	"fmt"
	"unicode/utf8"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
)

// Annotation marks a cordon of ours; its value says why. The chart's
// admission policy names the same key.
const Annotation = "gpu-device-plugin.github.io/cordoned"

// MaxReason bounds the annotation's value, in characters; the admission
// policy checks the same bound.
const MaxReason = 256

// API is what the Writer needs of the API server; *kubeapi.Client has it.
type API interface {
	GetNode(ctx context.Context, name string) (kubeapi.Node, error)
	PatchNodeScheduling(ctx context.Context, node string, p kubeapi.SchedulingPatch) error
}

// Outcome is what a Writer found, and did.
type Outcome string

// The outcomes.
const (
	// Cordoned: the Node was schedulable; now it is not, with our
	// annotation.
	Cordoned Outcome = "cordoned"
	// AlreadyOurs: the Node is already unschedulable with our annotation.
	AlreadyOurs Outcome = "alreadyOurs"
	// CordonedByOthers: unschedulable without our annotation: someone
	// else's cordon, left alone now and later.
	CordonedByOthers Outcome = "cordonedByOthers"
	// LiftedByOthers: schedulable with our annotation: someone uncordoned
	// our cordon. Cordon leaves it so; Uncordon removes the annotation.
	LiftedByOthers Outcome = "liftedByOthers"
	// Uncordoned: our cordon lifted and our annotation removed.
	Uncordoned Outcome = "uncordoned"
	// NotOurs: Uncordon found no annotation of ours: nothing to undo.
	NotOurs Outcome = "notOurs"
)

// Writer cordons and uncordons one Node.
type Writer struct {
	API  API
	Node string
}

// Cordon makes the Node unschedulable with our annotation saying why,
// unless it is unschedulable already (our cordon, or someone else's that
// we must not take over) or someone lifted our cordon (annotation kept,
// Node schedulable), whose word stands.
func (w Writer) Cordon(ctx context.Context, why string) (Outcome, error) {
	n, err := w.API.GetNode(ctx, w.Node)
	if err != nil {
		return "", fmt.Errorf("reading node %s before cordoning it: %w", w.Node, err)
	}
	_, ours := n.Metadata.Annotations[Annotation]
	switch {
	case n.Spec.Unschedulable && ours:
		return AlreadyOurs, nil
	case n.Spec.Unschedulable:
		return CordonedByOthers, nil
	case ours:
		return LiftedByOthers, nil
	}
	on, v := true, Reason(why)
	p := kubeapi.SchedulingPatch{Unschedulable: &on, Annotations: map[string]*string{Annotation: &v}, ResourceVersion: n.Metadata.ResourceVersion}
	if err := w.API.PatchNodeScheduling(ctx, w.Node, p); err != nil {
		return "", fmt.Errorf("cordoning node %s: %w", w.Node, err)
	}
	return Cordoned, nil
}

// Uncordon lifts our cordon: only a Node our annotation marks. Still
// unschedulable, it becomes schedulable and loses the annotation in one
// patch; already schedulable (someone uncordoned it), only the annotation
// goes, so that it does not stop a later cordon. A Node without our
// annotation is left as it is.
func (w Writer) Uncordon(ctx context.Context) (Outcome, error) {
	n, err := w.API.GetNode(ctx, w.Node)
	if err != nil {
		return "", fmt.Errorf("reading node %s before uncordoning it: %w", w.Node, err)
	}
	if _, ours := n.Metadata.Annotations[Annotation]; !ours {
		return NotOurs, nil
	}
	p := kubeapi.SchedulingPatch{Annotations: map[string]*string{Annotation: nil}, ResourceVersion: n.Metadata.ResourceVersion}
	out := LiftedByOthers
	if n.Spec.Unschedulable {
		off := false
		p.Unschedulable, out = &off, Uncordoned
	}
	if err := w.API.PatchNodeScheduling(ctx, w.Node, p); err != nil {
		return "", fmt.Errorf("uncordoning node %s: %w", w.Node, err)
	}
	return out, nil
}

// Reason is why as the annotation holds it: at most MaxReason characters.
func Reason(why string) string {
	if why == "" {
		why = "a GPU needs a node reboot"
	}
	if utf8.RuneCountInString(why) <= MaxReason {
		return why
	}
	r := []rune(why)
	return string(r[:MaxReason-1]) + "…"
}
