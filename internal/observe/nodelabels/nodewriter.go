package nodelabels

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/kubeapi"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/labels"
)

// Annotation lists, comma-separated and sorted, the label keys the Node
// writer keeps on its Node: the keys it deletes once it no longer computes
// them, so it never deletes a label someone else set.
const Annotation = "gpu-device-plugin.github.io/node-labels"

// API is what the Node writer needs of the API server; *kubeapi.Client
// has it.
type API interface {
	GetNode(ctx context.Context, name string) (kubeapi.Node, error)
	PatchNodeMetadata(ctx context.Context, node string, p kubeapi.MetadataPatch) error
}

// NodeWriter sets the labels on the Node itself, for clusters without NFD.
type NodeWriter struct {
	API  API
	Node string
}

// Sync reads the Node and, only when its labels differ from l, patches it
// once (Patch). It says whether it patched.
func (w NodeWriter) Sync(ctx context.Context, l labels.Labels) (bool, error) {
	n, err := w.API.GetNode(ctx, w.Node)
	if err != nil {
		return false, fmt.Errorf("reading node %s's labels: %w", w.Node, err)
	}
	p := Patch(n.Metadata, l)
	if p.Empty() {
		return false, nil
	}
	if err := w.API.PatchNodeMetadata(ctx, w.Node, p); err != nil {
		return false, fmt.Errorf("labelling node %s: %w", w.Node, err)
	}
	return true, nil
}

// Patch is the change that brings a Node's metadata m to labels l: l's
// keys whose value differs, a deletion for each key Annotation names that
// l no longer has, and Annotation itself when l's keys differ from it. It
// is empty when the Node is already right. Only keys labels.IsKey accepts
// are set or deleted, whatever the annotation says: a hand-edited one must
// not make the plugin delete another agent's label (which the chart's
// admission policy would refuse anyway, failing every later patch).
func Patch(m kubeapi.ObjectMeta, l labels.Labels) kubeapi.MetadataPatch {
	var p kubeapi.MetadataPatch
	set := func(to *map[string]*string, k string, v *string) {
		if *to == nil {
			*to = map[string]*string{}
		}
		(*to)[k] = v
	}
	var keys []string
	for _, k := range l.Keys() {
		if !labels.IsKey(k) {
			continue
		}
		keys = append(keys, k)
		if old, ok := m.Labels[k]; !ok || old != l[k] {
			v := l[k]
			set(&p.Labels, k, &v)
		}
	}
	for _, k := range owned(m.Annotations[Annotation]) {
		if _, still := l[k]; still {
			continue
		}
		if _, ok := m.Labels[k]; ok {
			set(&p.Labels, k, nil)
		}
	}
	list := strings.Join(keys, ",")
	old, had := m.Annotations[Annotation]
	switch {
	case list == "" && had:
		set(&p.Annotations, Annotation, nil)
	case list != "" && old != list:
		set(&p.Annotations, Annotation, &list)
	}
	return p
}

// owned is the label keys an Annotation value names, those of ours only.
func owned(v string) []string {
	keys := map[string]bool{}
	for k := range strings.SplitSeq(v, ",") {
		if k = strings.TrimSpace(k); labels.IsKey(k) {
			keys[k] = true
		}
	}
	return slices.Sorted(maps.Keys(keys))
}
