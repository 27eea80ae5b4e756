package config

import (
	"reflect"
	"strings"
	"testing"
)

// The imex section: from the file, a flag's form and Values, and the
// checks, each one line naming its key and where it came from.
func TestIMEXSettings(t *testing.T) {
	if d := Default().IMEX; d.ChannelIDs != nil || d.Required {
		t.Fatalf("defaults %+v: no channel, not required", d)
	}
	c, err := Parse("f.yaml", []byte("imex:\n  channelIDs: [0]\n  required: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.IMEX, IMEX{ChannelIDs: []int{0}, Required: true}) {
		t.Fatalf("from the file: %+v", c.IMEX)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("channel 0, required: %v", err)
	}
	if v := c.Values(); v["imex.channelIDs"] != "0" || v["imex.required"] != "true" || v["imex"] != "" {
		t.Errorf("Values: imex.channelIDs %q, imex.required %q", v["imex.channelIDs"], v["imex.required"])
	}
	if err := c.Set("imex.channelIDs", ""); err != nil || len(c.IMEX.ChannelIDs) != 0 {
		t.Errorf("an empty flag: %v %+v", err, c.IMEX)
	}
	if err := c.Set("imex.channelIDs", " 0 "); err != nil || !reflect.DeepEqual(c.IMEX.ChannelIDs, []int{0}) {
		t.Errorf("Set: %v %+v", err, c.IMEX)
	}
	if err := c.Set("imex.channelIDs", "zero"); err == nil || err.Error() != `config: imex.channelIDs: "zero" is not a list of whole numbers (example: "0")` {
		t.Errorf("not a number: %v", err)
	}
	if _, err := Parse("f.yaml", []byte("imex:\n  channels: [0]\n")); err == nil || !strings.Contains(err.Error(), "channels") {
		t.Errorf("an unknown key of the section: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"a channel other than 0", func(c *Config) { c.IMEX.ChannelIDs = []int{1} },
			"config: imex.channelIDs (--imex-channel-ids): [1]: only channel 0 or none can be given to every container (as NVIDIA's imex.channelIDs); set it to 0, or leave it empty"},
		{"two channels", func(c *Config) { c.IMEX.ChannelIDs = []int{0, 0} },
			"config: imex.channelIDs (--imex-channel-ids): [0 0]: only channel 0 or none can be given to every container (as NVIDIA's imex.channelIDs); set it to 0, or leave it empty"},
		{"DRA mode", func(c *Config) { c.IMEX.ChannelIDs, c.KubeletAPI, c.DRAPluginDir = []int{0}, KubeletAPIDRA, "/x" },
			"config: imex.channelIDs (--imex-channel-ids): [0] needs kubeletAPI device-plugin; in DRA mode IMEX channels come with ComputeDomains: leave it empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.edit(&c)
			if err := c.Validate(); err == nil || err.Error() != tc.want {
				t.Errorf("got %v\nwant %s", err, tc.want)
			}
		})
	}
	// NVIDIA allows required with no channel; so do we: it requires nothing.
	c = Default()
	c.IMEX.Required = true
	if err := c.Validate(); err != nil {
		t.Errorf("required, no channel: %v", err)
	}
}

// imex.computeDomains needs DRA mode and a node address, each refused on
// one line naming the key and the fix.
func TestIMEXComputeDomains(t *testing.T) {
	for _, tc := range []struct {
		name, file, want string
	}{
		{"DRA with an address", "kubeletAPI: dra\nimex:\n  computeDomains: true\n  nodeIP: 10.0.0.7\n", ""},
		{"no address", "kubeletAPI: dra\nimex:\n  computeDomains: true\n", `imex.nodeIP (--imex-node-ip): "" is not an IP address`},
		{"not an address", "kubeletAPI: dra\nimex:\n  computeDomains: true\n  nodeIP: node-a\n", `"node-a" is not an IP address`},
		{"device-plugin mode", "imex:\n  computeDomains: true\n  nodeIP: 10.0.0.7\n", "imex.computeDomains (--imex-compute-domains): true needs kubeletAPI dra"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("f.yaml", []byte(tc.file))
			if err != nil {
				t.Fatal(err)
			}
			err = c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
