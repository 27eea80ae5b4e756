package computedomain

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	cd "github.com/gpu-device-plugin/gpu-device-plugin/internal/model/computedomain"
)

// jsonKeys are the JSON keys of a struct type's fields.
func jsonKeys(t reflect.Type) []string {
	var ks []string
	for f := range t.Fields() {
		k, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

type schemaNode struct {
	Properties map[string]schemaNode `json:"properties"`
	Items      *schemaNode           `json:"items"`
	Enum       []string              `json:"enum"`
	Maximum    *int                  `json:"maximum"`
	ListType   string                `json:"x-kubernetes-list-type"`
	MapKeys    []string              `json:"x-kubernetes-list-map-keys"`
}

func keys(m map[string]schemaNode) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestCRDMatchesTypes pins the chart's CRD to the Go types: every key the
// types write is in the schema and no other, the group, kind and version
// are the code's, the nodes list is a map by name.
func TestCRDMatchesTypes(t *testing.T) {
	b, err := os.ReadFile("../../../deploy/helm/gpu-device-plugin/crds/computedomains.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Metadata struct{ Name string }
		Spec     struct {
			Group    string
			Names    struct{ Kind, Plural string }
			Versions []struct {
				Name   string
				Schema struct {
					OpenAPIV3Schema schemaNode `json:"openAPIV3Schema"`
				}
			}
		}
	}
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Metadata.Name != cd.Resource+"."+cd.Group || crd.Spec.Group != cd.Group || crd.Spec.Names.Kind != cd.Kind || crd.Spec.Names.Plural != cd.Resource {
		t.Errorf("names: %+v", crd)
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != cd.Version {
		t.Fatalf("versions: %+v", crd.Spec.Versions)
	}
	root := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	spec, status := root.Properties["spec"], root.Properties["status"]
	nodes := status.Properties["nodes"]
	channel := spec.Properties["channel"]
	for _, c := range []struct {
		at     string
		schema []string
		typ    reflect.Type
	}{
		{"spec", keys(spec.Properties), reflect.TypeFor[cd.Spec]()},
		{"spec.channel", keys(channel.Properties), reflect.TypeFor[cd.Channel]()},
		{"spec.channel.resourceClaimTemplate", keys(channel.Properties["resourceClaimTemplate"].Properties), reflect.TypeFor[cd.TemplateRef]()},
		{"status", keys(status.Properties), reflect.TypeFor[cd.Status]()},
		{"status.nodes[]", keys(nodes.Items.Properties), reflect.TypeFor[cd.Node]()},
	} {
		if want := jsonKeys(c.typ); !slices.Equal(c.schema, want) {
			t.Errorf("%s: schema has %v, the Go type %v", c.at, c.schema, want)
		}
	}
	if nodes.ListType != "map" || !slices.Equal(nodes.MapKeys, []string{"name"}) {
		t.Errorf("status.nodes must be a map keyed by name (one field manager per node): %+v", nodes)
	}
	if m := spec.Properties["numNodes"].Maximum; m == nil || *m != cd.MaxNodes {
		t.Errorf("numNodes maximum: %v, want %d", m, cd.MaxNodes)
	}
	if e := channel.Properties["allocationMode"].Enum; !slices.Equal(e, []string{cd.AllocationSingle, cd.AllocationAll}) {
		t.Errorf("allocationMode enum: %v", e)
	}
	if e := status.Properties["status"].Enum; !slices.Equal(e, []string{cd.Ready, cd.NotReady}) {
		t.Errorf("status enum: %v", e)
	}
}
