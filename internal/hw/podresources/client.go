package podresources

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/grpcwire"
)

// ErrUnavailable is wrapped by every error that means the API could not
// be reached: no socket, a socket this process may not open, or nothing
// listening on it. Callers treat it as "not known here", unlike an error
// the kubelet answered with.
var ErrUnavailable = errors.New("kubelet PodResources API unavailable")

// DefaultTimeout bounds one List or Holders call, dial included, when the context
// has no earlier deadline.
const DefaultTimeout = 5 * time.Second

// maxMessageSize is what the kubelet's own client allows: a List on a
// busy node outgrows gRPC's 4 MiB default.
const maxMessageSize = 16 << 20

// Holder is one container.
type Holder struct {
	Namespace string
	Pod       string
	Container string
}

// String is namespace/pod/container.
func (h Holder) String() string { return h.Namespace + "/" + h.Pod + "/" + h.Container }

func compareHolders(a, b Holder) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Container, b.Container))
}

type deviceKey struct{ resource, id string }

type draKey struct{ driver, pool, device string }

// Holders says who holds each device, as one List answered it. The zero
// value holds nothing.
type Holders struct {
	devices map[deviceKey][]Holder
	dra     map[draKey][]Holder
	// held is each container's device IDs by resource (device-plugin API).
	held map[Holder]map[string][]string
}

// DevicesOf is the device IDs container c holds through the device-plugin
// API, by resource; nil when none. Checkpoint.PodUID takes it.
func (h Holders) DevicesOf(c Holder) map[string][]string { return h.held[c] }

// Device returns the containers holding device id of a device-plugin
// resource, sorted; nil when none.
func (h Holders) Device(resource, id string) []Holder {
	return h.devices[deviceKey{resource, id}]
}

// DRADevice returns the containers whose claims hold a DRA device,
// sorted; nil when none.
func (h Holders) DRADevice(driver, pool, device string) []Holder {
	return h.dra[draKey{driver, pool, device}]
}

// Merge joins lists of holders, sorted and without repeats: a device
// reported through both APIs, or the same list twice, counts each
// container once.
func Merge(lists ...[]Holder) []Holder {
	var out []Holder
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.SortFunc(out, compareHolders)
	return slices.Compact(out)
}

// Names are every name the kubelet may know one device by: device IDs
// under a device-plugin resource (one per time-slicing replica), and a
// device of a DRA driver's pool. Empty parts are skipped.
type Names struct {
	Resource string
	IDs      []string
	// Driver, Pool and DRADevice name it in a ResourceSlice pool.
	Driver, Pool, DRADevice string
}

// Of is who holds the device named by n, under any of its names, each
// container once. The plugin, list, the metrics and the Events all ask
// this way.
func (h Holders) Of(n Names) []Holder {
	lists := make([][]Holder, 0, len(n.IDs)+1)
	for _, id := range n.IDs {
		lists = append(lists, h.Device(n.Resource, id))
	}
	if n.DRADevice != "" {
		lists = append(lists, h.DRADevice(n.Driver, n.Pool, n.DRADevice))
	}
	return Merge(lists...)
}

// FromList indexes a List answer.
func FromList(pods []Pod) Holders {
	h := Holders{devices: map[deviceKey][]Holder{}, dra: map[draKey][]Holder{}, held: map[Holder]map[string][]string{}}
	for _, p := range pods {
		for _, c := range p.Containers {
			who := Holder{Namespace: p.Namespace, Pod: p.Name, Container: c.Name}
			for _, d := range c.Devices {
				for _, id := range d.IDs {
					k := deviceKey{d.Resource, id}
					h.devices[k] = append(h.devices[k], who)
					if h.held[who] == nil {
						h.held[who] = map[string][]string{}
					}
					h.held[who][d.Resource] = append(h.held[who][d.Resource], id)
				}
			}
			for _, cl := range c.Claims {
				for _, r := range cl.Devices {
					k := draKey{r.Driver, r.Pool, r.Device}
					h.dra[k] = append(h.dra[k], who)
				}
			}
		}
	}
	// One claim may list a device twice (two requests, or shared
	// across the pod's containers): each container once, in one order.
	for k, l := range h.devices {
		h.devices[k] = Merge(l)
	}
	for k, l := range h.dra {
		h.dra[k] = Merge(l)
	}
	return h
}

// Client reads the PodResources API on a unix socket. Each call dials
// afresh, so a restarted kubelet is simply found again.
type Client struct {
	// Socket is the kubelet's socket,
	// /var/lib/kubelet/pod-resources/kubelet.sock by default.
	Socket string
	// Timeout bounds each call; zero is DefaultTimeout.
	Timeout time.Duration
}

// Holders lists every container's devices once.
func (c Client) Holders(ctx context.Context) (Holders, error) {
	resp, err := c.List(ctx)
	if err != nil {
		return Holders{}, err
	}
	return FromList(resp), nil
}

// List is the kubelet's answer to one List call: every pod's containers
// with their devices and DRA claims (name, namespace, and each device's
// driver, pool, name and CDI device IDs).
func (c Client) List(ctx context.Context) ([]Pod, error) {
	// Stat first: "no such file" or "permission denied" on the path says
	// more than the connection's error.
	if _, err := os.Stat(c.Socket); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn := grpcwire.NewClient(c.Socket, maxMessageSize)
	defer conn.Close()
	// A socket nobody listens on, or one we may not connect to, ends the
	// call at once with Unavailable.
	b, err := conn.Call(ctx, methodList, empty{})
	if err != nil {
		if grpcwire.CodeOf(err) == grpcwire.Unavailable {
			return nil, fmt.Errorf("%w at %s: %w", ErrUnavailable, c.Socket, err)
		}
		return nil, fmt.Errorf("kubelet PodResources List at %s: %w", c.Socket, err)
	}
	pods, err := DecodeList(b)
	if err != nil {
		return nil, fmt.Errorf("kubelet PodResources List at %s: %w", c.Socket, err)
	}
	return pods, nil
}

// DRADevicesWhere returns the containers whose claims hold any device of
// a DRA driver's pool whose name match accepts (a GPU's own device, its
// MIG devices and placements), sorted, each once; nil when none.
func (h Holders) DRADevicesWhere(driver, pool string, match func(device string) bool) []Holder {
	var lists [][]Holder
	for k, l := range h.dra {
		if k.driver == driver && k.pool == pool && match(k.device) {
			lists = append(lists, l)
		}
	}
	if len(lists) == 0 {
		return nil
	}
	return Merge(lists...)
}
