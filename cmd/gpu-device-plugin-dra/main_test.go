package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/config"
)

// TestResolvedConfigRoundTrip: what gpu-device-plugin serve passes is read
// back to the same configuration, NIC pools, MIG strategy, sharing and
// durations included.
func TestResolvedConfigRoundTrip(t *testing.T) {
	cfg, err := config.Load("../../internal/config/testdata/example-nics.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.KubeletAPI, cfg.NodeName, cfg.PodUID, cfg.Kubeconfig = config.KubeletAPIDRA, "node-a", "uid-1", "/etc/kubernetes/kubelet.conf"
	cfg.XIDIgnore = []uint64{13}
	shared, err := config.Load("../../internal/config/testdata/example-sharing.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MIGStrategy, cfg.Sharing = shared.MIGStrategy, shared.Sharing
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := resolvedConfig([]string{"--resolved-config", string(js)})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, cfg) {
		t.Errorf("round trip changed the configuration:\n got %+v\nwant %+v", got, cfg)
	}
}

func TestResolvedConfigRefusals(t *testing.T) {
	dp, _ := json.Marshal(config.Default())
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"run by hand":        {nil, "gpu-device-plugin serve --kubelet-api=dra"},
		"not JSON":           {[]string{"--resolved-config", "{"}, "--resolved-config"},
		"device-plugin mode": {[]string{"--resolved-config", string(dp)}, `kubeletAPI is "device-plugin"`},
		"invalid setting":    {[]string{"--resolved-config", `{"kubeletAPI":"dra","logLevel":"loud"}`}, "logLevel"},
	} {
		if _, err := resolvedConfig(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one with %q", name, err, tc.want)
		}
	}
}

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
