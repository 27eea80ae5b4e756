package policy_test

import (
	"testing"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/policy"
	"github.com/gpu-device-plugin/gpu-device-plugin/internal/model/health/xid"
)

// TestXID: a single XID's class wins over both lists, in both directions;
// the lists decide the rest, fatal over ignored; a transient XID with no
// recovery period is sticky.
func TestXID(t *testing.T) {
	base := policy.Policy{IgnoredXIDs: []uint64{13, 31, 74}, FatalXIDs: []uint64{74, 79}, XIDRecovery: time.Minute}
	over := base
	over.XIDs = map[uint64]policy.XIDAction{
		79: policy.Action(xid.Ignore),
		13: policy.Action(xid.Fatal),
		31: policy.Action(xid.Transient),
	}
	noRecovery := over
	noRecovery.XIDRecovery = 0
	for _, tc := range []struct {
		name string
		p    policy.Policy
		xid  uint64
		want policy.XIDAction
	}{
		{"fatal list wins over ignore list", base, 74, policy.XIDSticky},
		{"ignore list", base, 13, policy.XIDIgnore},
		{"fatal list", base, 79, policy.XIDSticky},
		{"neither list: transient", base, 94, policy.XIDTransient},
		{"xids ignores a fatal XID", over, 79, policy.XIDIgnore},
		{"xids makes an ignored XID fatal", over, 13, policy.XIDSticky},
		{"xids makes an ignored XID transient", over, 31, policy.XIDTransient},
		{"xids leaves the rest to the lists", over, 74, policy.XIDSticky},
		{"transient without a recovery period is sticky", noRecovery, 31, policy.XIDSticky},
		{"xids ignore holds without a recovery period", noRecovery, 79, policy.XIDIgnore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.XID(tc.xid); got != tc.want {
				t.Errorf("XID(%d) = %v, want %v", tc.xid, got, tc.want)
			}
		})
	}
}

// The defaults are the catalog's.
func TestDefaultsAreTheCatalogs(t *testing.T) {
	p := policy.Default()
	for _, e := range xid.Catalog() {
		if got, want := p.XID(e.XID), policy.Action(e.Health); got != want {
			t.Errorf("XID %d (%s, %s): %v, want %v", e.XID, e.Bucket, e.Health, got, want)
		}
	}
	if got := p.XID(1); got != policy.XIDTransient {
		t.Errorf("an XID the catalog does not list: %v, want transient", got)
	}
}
