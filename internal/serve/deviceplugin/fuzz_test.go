package deviceplugin

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
	api "github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/deviceplugin/v1beta1"
)

// fuzzIDs is what the fuzzer picks device IDs from, by byte: the server's
// devices (GPU-b unhealthy) and some it does not have.
var fuzzIDs = []string{"GPU-a", "GPU-b", "GPU-c", "GPU-d", "", "bogus", "GPU-a ", "\xff"}

// pick turns fuzz bytes into IDs; the high bit of a byte repeats the ID
// 1000 times, so a short input can name one device thousands of times.
func pick(b []byte) []string {
	var out []string
	for _, x := range b {
		id := fuzzIDs[int(x&0x7f)%len(fuzzIDs)]
		n := 1
		if x&0x80 != 0 {
			n = 1000
		}
		for range n {
			out = append(out, id)
		}
	}
	return out
}

// FuzzHandlers drives the handlers the kubelet calls outside
// ListAndWatch with arbitrary requests and checks every answer: no panic;
// Allocate answers OK exactly when every container names known, healthy
// devices once each, with the backend getting exactly those, and
// InvalidArgument naming the offending ID otherwise; GetPreferredAllocation
// always answers OK (it is a hint), with distinct, known, available IDs
// that include every usable must-include one, no more than asked for.
func FuzzHandlers(f *testing.F) {
	f.Add([]byte{0, 2}, []byte{}, []byte{0, 1, 2}, []byte{2}, int32(2))
	f.Add([]byte{0, 0}, []byte{2}, []byte{0, 0, 5}, []byte{0, 0}, int32(1))
	f.Add([]byte{0x82}, []byte{}, []byte{0x80, 0x81}, []byte{}, int32(-1))
	f.Add([]byte{1}, []byte{3}, []byte{4, 5, 6, 7}, []byte{3}, int32(1<<30))
	f.Add([]byte{}, []byte{}, []byte{}, []byte{}, int32(0))
	f.Add([]byte{7, 6}, []byte{0, 2}, []byte{2, 1, 0}, []byte{1, 2}, int32(3))

	s, err := New(Options{ResourceName: "example.com/gpu", SocketDir: f.TempDir(), Backend: preferringBackend{}})
	if err != nil {
		f.Fatal(err)
	}
	s.SetDevices(testDevices())
	s.SetHealth("GPU-b", false, "xid=79")
	v := &service{s: s}
	ctx := context.Background()

	f.Fuzz(func(t *testing.T, c1, c2, avail, must []byte, size int32) {
		// Allocate, two containers.
		req := &api.AllocateRequest{}
		for _, c := range [][]byte{c1, c2} {
			req.ContainerRequests = append(req.ContainerRequests, pick(c))
		}
		resp, err := v.Allocate(ctx, req)
		bad := firstBad(s.current(), req)
		switch code := grpcwire.CodeOf(err); {
		case bad == "" && code != grpcwire.OK:
			t.Fatalf("Allocate(%v) = %v; every ID is usable", req, err)
		case bad != "" && code != grpcwire.InvalidArgument:
			t.Fatalf("Allocate(%v) = %v; want InvalidArgument about %s", req, err, bad)
		case bad != "" && !strings.Contains(err.Error(), bad):
			t.Fatalf("Allocate error %q does not name %s", err, bad)
		case bad == "":
			if len(resp.ContainerResponses) != len(req.ContainerRequests) {
				t.Fatalf("%d answers for %d containers", len(resp.ContainerResponses), len(req.ContainerRequests))
			}
			for i, cr := range resp.ContainerResponses {
				if got, want := cr.Envs["IDS"], strings.Join(req.ContainerRequests[i], ","); got != want {
					t.Fatalf("container %d: backend got %q, want %q", i, got, want)
				}
			}
		}

		// GetPreferredAllocation, one container.
		preq := &api.PreferredAllocationRequest{ContainerRequests: []api.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: pick(avail), MustIncludeDeviceIDs: pick(must), AllocationSize: size,
		}}}
		presp, err := v.GetPreferredAllocation(ctx, preq)
		if err != nil {
			t.Fatalf("GetPreferredAllocation(%v) = %v; a hint never fails", preq, err)
		}
		if len(presp.ContainerResponses) != 1 {
			t.Fatalf("%d answers for one container", len(presp.ContainerResponses))
		}
		got := presp.ContainerResponses[0]
		creq := preq.ContainerRequests[0]
		known := func(id string) bool { return s.current().has(id) }
		usable := slices.DeleteFunc(slices.Clone(creq.AvailableDeviceIDs), func(id string) bool { return !known(id) })
		slices.Sort(usable)
		usable = slices.Compact(usable)
		if len(got) > max(int(size), 0) && len(got) > 0 {
			// Only must-includes may push it past the asked size.
			for _, id := range got {
				if !slices.Contains(creq.MustIncludeDeviceIDs, id) {
					t.Fatalf("preferred %v: more than the %d asked for", got, size)
				}
			}
		}
		if want := min(max(int(size), 0), len(usable)); len(got) < want {
			t.Fatalf("preferred %v: %d devices, want at least %d of %v", got, len(got), want, usable)
		}
		seen := map[string]bool{}
		for _, id := range got {
			if seen[id] {
				t.Fatalf("preferred %v: %s twice", got, id)
			}
			seen[id] = true
			if !slices.Contains(usable, id) {
				t.Fatalf("preferred %v: %s is not a known available device", got, id)
			}
		}
		for _, id := range creq.MustIncludeDeviceIDs {
			if slices.Contains(usable, id) && !seen[id] {
				t.Fatalf("preferred %v lacks must-include %s", got, id)
			}
		}
	})
}

// firstBad returns the ID, or "no device", Allocate must complain about;
// "" when the request is good.
func firstBad(snap *snapshot, req *api.AllocateRequest) string {
	for _, c := range req.ContainerRequests {
		if len(c) == 0 {
			return "no device"
		}
		seen := map[string]bool{}
		for _, id := range c {
			d, ok := snap.lookup(id)
			if !ok || seen[id] || !d.Healthy {
				return strconv.Quote(id)
			}
			seen[id] = true
		}
	}
	return ""
}
