package computedomain

import (
	"strings"
	"testing"
	"time"
)

func spec(n int) Spec {
	return Spec{NumNodes: n, Channel: &Channel{ResourceClaimTemplate: TemplateRef{Name: "job-channel"}}}
}

func TestEvaluate(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	fresh := now.Add(-10 * time.Second).Format(time.RFC3339)
	old := now.Add(-10 * time.Minute).Format(time.RFC3339)
	node := func(name, clique, status, hb string) Node {
		return Node{Name: name, IPAddress: "10.0.0." + name[len(name)-1:], CliqueID: clique, Status: status, Heartbeat: hb}
	}
	a, b := "c0ffee00-0000-0000-0000-000000000001.1", "c0ffee00-0000-0000-0000-000000000001.2"
	facts := Facts{CliqueNodes: map[string]int{a: 3, b: 3}, Now: now, NodeTimeout: time.Minute}
	for _, c := range []struct {
		name      string
		spec      Spec
		nodes     []Node
		facts     Facts
		status    string
		reason    string
		bad       bool
		inMessage string
	}{
		{"ready when numNodes daemons are ready in one clique", spec(2),
			[]Node{node("n2", a, Ready, fresh), node("n1", a, Ready, fresh)}, facts, Ready, ReasonDomainReady, false, "2 nodes"},
		{"waits for nodes not yet joined", spec(3),
			[]Node{node("n1", a, Ready, fresh)}, facts, NotReady, ReasonWaitingForNodes, false, "1 of 3"},
		{"waits for daemons, naming the nodes", spec(2),
			[]Node{node("n1", a, Ready, fresh), node("n2", a, NotReady, fresh)}, facts, NotReady, ReasonDaemonsStarting, false, "waiting for n2"},
		{"mixed cliques cannot work", spec(2),
			[]Node{node("n1", a, Ready, fresh), node("n4", b, Ready, fresh)}, facts, NotReady, ReasonMixedCliques, true, b + ": n4"},
		{"more nodes than the largest clique", spec(4),
			nil, facts, NotReady, ReasonTooManyNodes, true, "largest clique"},
		{"more nodes than an NVLink domain", spec(19),
			nil, Facts{}, NotReady, ReasonTooManyNodes, true, "at most 18"},
		{"clique sizes unknown: only the domain limit", spec(4),
			nil, Facts{}, NotReady, ReasonWaitingForNodes, false, "0 of 4"},
		{"a lost node is reported, not hidden", spec(2),
			[]Node{node("n1", a, Ready, fresh), node("n2", a, Ready, old)}, facts, NotReady, ReasonNodeLost, false, "n2"},
		{"a bad spec", Spec{NumNodes: 0}, nil, facts, NotReady, ReasonInvalidSpec, true, "spec.numNodes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, bad := Evaluate(c.spec, c.nodes, c.facts)
			if st.Status != c.status || st.Reason != c.reason || bad != c.bad {
				t.Fatalf("got %s/%s unsatisfiable=%v (%s), want %s/%s %v", st.Status, st.Reason, bad, st.Message, c.status, c.reason, c.bad)
			}
			if !strings.Contains(st.Message, c.inMessage) {
				t.Errorf("message %q lacks %q", st.Message, c.inMessage)
			}
			if len(st.Nodes) != len(c.nodes) {
				t.Errorf("nodes: got %d, want %d (none hidden)", len(st.Nodes), len(c.nodes))
			}
			for _, n := range st.Nodes {
				if n.Heartbeat == old && n.Reason != ReasonNodeLost {
					t.Errorf("node %s: stale heartbeat not marked lost: %+v", n.Name, n)
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	s := spec(2)
	s.Channel.AllocationMode = "Many"
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "spec.channel.allocationMode") {
		t.Errorf("bad mode: %v", err)
	}
	if err := (Spec{NumNodes: 1}).Validate(); err == nil || !strings.Contains(err.Error(), "resourceClaimTemplate.name") {
		t.Errorf("no template: %v", err)
	}
	if err := spec(2).Validate(); err != nil {
		t.Error(err)
	}
}

func TestPeers(t *testing.T) {
	nodes := []Node{
		{Name: "n3", IPAddress: "10.0.0.3", CliqueID: "x.1"},
		{Name: "n1", IPAddress: "10.0.0.1", CliqueID: "x.1"},
		{Name: "n9", IPAddress: "10.0.0.9", CliqueID: "x.2"},
		{Name: "n2", IPAddress: "10.0.0.2", CliqueID: "x.1", Reason: ReasonNodeLost},
	}
	got := strings.Join(Peers(nodes, "x.1"), " ")
	if got != "10.0.0.1 10.0.0.2 10.0.0.3" {
		t.Errorf("peers: %s", got)
	}
	if NodesConfigFile(Peers(nodes, "x.1")) != "10.0.0.1\n10.0.0.2\n10.0.0.3\n" {
		t.Error("nodes_config.cfg is one address a line")
	}
}

func TestConfigFileRoundTrip(t *testing.T) {
	c := IMEX{BindIP: "127.0.0.11", ServerPort: 50000, CmdPort: 50005, NodesFile: "/run/d/nodes_config.cfg", LogFile: "/run/d/imex.log", PIDFile: "/run/d/imex.pid"}
	kv, err := ParseConfigFile(c.ConfigFile())
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"SERVER_IP_ADDRESS": "127.0.0.11", "SERVER_PORT": "50000", "IMEX_CMD_PORT": "50005",
		"IMEX_CMD_ENABLED": "1", "IMEX_NODE_CONFIG_FILE": "/run/d/nodes_config.cfg", "IMEX_DAEMON_PID_FILE": "/run/d/imex.pid"} {
		if kv[k] != want {
			t.Errorf("%s = %q, want %q", k, kv[k], want)
		}
	}
	if _, err := ParseConfigFile("SERVER_PORT"); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("a line without '=': %v", err)
	}
}

func TestCliqueID(t *testing.T) {
	if got := CliqueID("abc", 7); got != "abc.7" {
		t.Error(got)
	}
}
