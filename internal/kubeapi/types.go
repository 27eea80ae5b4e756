package kubeapi

import (
	"encoding/json"
	"time"
)

// The types below are the fields of core/v1 objects this package sends
// or reads, under the API's own JSON names.

// Time is a timestamp as the API writes it: RFC 3339, UTC, whole
// seconds; the zero time is null.
type Time struct{ time.Time }

// NewTime is t as the API keeps it: UTC, whole seconds.
func NewTime(t time.Time) Time { return Time{t.UTC().Truncate(time.Second)} }

// MarshalJSON writes RFC 3339 in UTC, whole seconds, or null.
func (t Time) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return json.Marshal(t.UTC().Format(time.RFC3339))
}

// UnmarshalJSON reads RFC 3339 or null.
func (t *Time) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		t.Time = time.Time{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return err
	}
	t.Time = v
	return nil
}

// ObjectMeta is the part of metadata used here.
type ObjectMeta struct {
	Name         string `json:"name,omitempty"`
	GenerateName string `json:"generateName,omitempty"`
	Namespace    string `json:"namespace,omitempty"`
	UID          string `json:"uid,omitempty"`
	// ResourceVersion is read from Nodes, for a patch that must not apply
	// to a Node changed since (SchedulingPatch).
	ResourceVersion string `json:"resourceVersion,omitempty"`
	// Labels and Annotations are read from Nodes; omitted when empty, so
	// the Events sent carry none.
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// OwnerReferences are read from Pods (their DaemonSet) and written on
	// NodeFeatures.
	OwnerReferences []OwnerReference `json:"ownerReferences,omitempty"`
}

// OwnerReference names an object's owner, which the garbage collector
// waits for: the object goes once every owner has.
type OwnerReference struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
	Controller *bool  `json:"controller,omitempty"`
}

// MetadataPatch is a JSON merge patch of an object's labels and
// annotations: a key with a value sets it, a key with nil deletes it, and
// keys not named are left alone.
type MetadataPatch struct {
	Labels      map[string]*string `json:"labels,omitempty"`
	Annotations map[string]*string `json:"annotations,omitempty"`
}

// Empty says whether p changes nothing.
func (p MetadataPatch) Empty() bool { return len(p.Labels) == 0 && len(p.Annotations) == 0 }

// SchedulingPatch is a JSON merge patch of a Node's spec.unschedulable
// (nil leaves it alone) and annotations (as MetadataPatch's). With
// ResourceVersion set, the API server applies it only to that version of
// the Node, else answers 409 Conflict: a cordon decided on a read is not
// written over a change made since.
type SchedulingPatch struct {
	Unschedulable   *bool
	Annotations     map[string]*string
	ResourceVersion string
}

// ObjectReference names the object an Event is about.
type ObjectReference struct {
	Kind       string `json:"kind,omitempty"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name,omitempty"`
	UID        string `json:"uid,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
}

// EventSource is the component that reports an Event.
type EventSource struct {
	Component string `json:"component,omitempty"`
	Host      string `json:"host,omitempty"`
}

// Event types.
const (
	EventNormal  = "Normal"
	EventWarning = "Warning"
)

// Event is a core/v1 Event, in its legacy form (no eventTime), which is
// what kubectl describe lists and what count aggregation applies to.
type Event struct {
	Metadata           ObjectMeta      `json:"metadata"`
	InvolvedObject     ObjectReference `json:"involvedObject"`
	Reason             string          `json:"reason,omitempty"`
	Message            string          `json:"message,omitempty"`
	Type               string          `json:"type,omitempty"`
	Source             EventSource     `json:"source,omitzero"`
	FirstTimestamp     Time            `json:"firstTimestamp"`
	LastTimestamp      Time            `json:"lastTimestamp"`
	Count              int32           `json:"count,omitempty"`
	ReportingComponent string          `json:"reportingComponent,omitempty"`
	ReportingInstance  string          `json:"reportingInstance,omitempty"`
}

// Condition statuses.
const (
	ConditionTrue    = "True"
	ConditionFalse   = "False"
	ConditionUnknown = "Unknown"
)

// NodeCondition is one entry of a Node's status.conditions.
type NodeCondition struct {
	Type               string `json:"type"`
	Status             string `json:"status"`
	Reason             string `json:"reason,omitempty"`
	Message            string `json:"message,omitempty"`
	LastHeartbeatTime  Time   `json:"lastHeartbeatTime"`
	LastTransitionTime Time   `json:"lastTransitionTime"`
}

// Node is the part of a Node read here.
type Node struct {
	Metadata ObjectMeta `json:"metadata"`
	Spec     struct {
		Unschedulable bool `json:"unschedulable,omitempty"`
	} `json:"spec"`
	Status struct {
		Conditions []NodeCondition `json:"conditions,omitempty"`
	} `json:"status"`
}

// Condition returns the node's condition of type t, if it has one.
func (n Node) Condition(t string) (NodeCondition, bool) {
	for _, c := range n.Status.Conditions {
		if c.Type == t {
			return c, true
		}
	}
	return NodeCondition{}, false
}

// NodeFeature is Node Feature Discovery's nfd.k8s-sigs.io/v1alpha1
// NodeFeature: features and labels an agent asks nfd-master to put on the
// Node its nfd.node.kubernetes.io/node-name label names.
type NodeFeature struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   ObjectMeta      `json:"metadata"`
	Spec       NodeFeatureSpec `json:"spec"`
}

// NodeFeatureSpec holds the labels; Features stays empty here (its three
// maps written as {}, as NFD's own types write an empty set).
type NodeFeatureSpec struct {
	Features NodeFeatureFeatures `json:"features"`
	Labels   map[string]string   `json:"labels"`
}

// NodeFeatureFeatures are NFD's raw feature sets, which nfd-master's rules
// match on; none are sent, and those read back are kept as they came.
type NodeFeatureFeatures struct {
	Flags      map[string]json.RawMessage `json:"flags"`
	Attributes map[string]json.RawMessage `json:"attributes"`
	Instances  map[string]json.RawMessage `json:"instances"`
}

// NodeFeature's API group and version.
const (
	NodeFeatureAPIVersion = "nfd.k8s-sigs.io/v1alpha1"
	NodeFeatureKind       = "NodeFeature"
)

// Pod is the part of a Pod read here.
type Pod struct {
	Metadata ObjectMeta `json:"metadata"`
}

// status is a metav1.Status, the body of an API error.
type status struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Code    int    `json:"code"`
}
