package deploy

import (
	"strings"
	"testing"
)

// The strict decoder is what makes the manifest tests worth anything:
// pin that it refuses what a lenient one would let through.
func TestDecodeStrictRefuses(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown field", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndatta: {}\n", `unknown field "datta"`},
		{"misplaced field", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  priorityClassName: system-node-critical\n", `unknown field "priorityClassName"`},
		{"duplicate key", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n", "duplicate"},
		{"kind not shipped", "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n", "unexpected v1 Secret"},
		{"wrong type", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: nine}]}\n", "cannot unmarshal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeStrict(tc.name, []byte("# comment only\n---\n"+tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decodeStrict: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestValidateRefuses(t *testing.T) {
	objs, err := decodeStrict("bad", []byte(`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: x, namespace: kube-system}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: c}}
    spec:
      containers: [{name: c, image: i, volumeMounts: [{name: missing, mountPath: /x}]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	errs := objs.validate()
	for _, want := range []string{"does not match template `labels`", "volumeMounts[0].name: Not found"} {
		if !strings.Contains(errs.ToAggregate().Error(), want) {
			t.Errorf("validate: %v, want an error containing %q", errs.ToAggregate(), want)
		}
	}
}
