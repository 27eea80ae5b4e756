package main

import (
	"strings"
	"testing"
	"time"
)

func TestControllerFlags(t *testing.T) {
	var sink strings.Builder
	if _, err := parseControllerFlags([]string{"--namespace="}, &sink); err == nil || !strings.Contains(err.Error(), "POD_NAMESPACE") {
		t.Errorf("no namespace: %v", err)
	}
	if _, err := parseControllerFlags([]string{"--namespace=gpu", "--node-timeout=1s"}, &sink); err == nil || !strings.Contains(err.Error(), "--node-timeout") {
		t.Errorf("short timeout: %v", err)
	}
	f, err := parseControllerFlags([]string{"--namespace=gpu", "--lease-name=l"}, &sink)
	if err != nil || f.namespace != "gpu" || f.leaseName != "l" || f.nodeTimeout != 2*time.Minute {
		t.Errorf("got %+v %v", f, err)
	}
}
