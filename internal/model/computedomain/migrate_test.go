package computedomain

import (
	"strings"
	"testing"
)

func TestMigrate(t *testing.T) {
	in := `# the job's domain
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: job
spec:
  numNodes: 4 # one rack's half
  channel:
    resourceClaimTemplate:
      name: job-channel
---
apiVersion: resource.nvidia.com/v1beta1
kind: DeviceClass
metadata:
  name: untouched
---
apiVersion: v1
kind: Pod
metadata:
  name: worker
spec:
  resourceClaims:
  - name: channel
    resourceClaimTemplateName: job-channel
`
	out, n, err := Migrate([]byte(in))
	if err != nil || n != 1 {
		t.Fatalf("n=%d err=%v", n, err)
	}
	want := strings.Replace(in, "apiVersion: resource.nvidia.com/v1beta1\nkind: ComputeDomain", "apiVersion: gpu-device-plugin.github.io/v1alpha1\nkind: ComputeDomain", 1)
	if string(out) != want {
		t.Errorf("got:\n%s\nwant:\n%s", out, want)
	}
	// Ours already: nothing to do, nothing changed.
	again, n, err := Migrate(out)
	if err != nil || n != 0 || string(again) != string(out) {
		t.Errorf("second run: n=%d err=%v", n, err)
	}
}

func TestMigrateRefusesUnknownSpecKeys(t *testing.T) {
	_, _, err := Migrate([]byte("apiVersion: resource.nvidia.com/v1beta1\nkind: ComputeDomain\nmetadata: {name: job}\nspec:\n  numNodes: 2\n  topology: x\n"))
	if err == nil || !strings.Contains(err.Error(), "spec.topology") || !strings.Contains(err.Error(), "ComputeDomain job") {
		t.Errorf("got %v", err)
	}
}
