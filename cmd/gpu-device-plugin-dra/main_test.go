package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

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
