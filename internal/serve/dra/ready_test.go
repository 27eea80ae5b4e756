package dra

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/gpu-device-plugin/gpu-device-plugin/internal/serve/dra/slicepub"
)

// failingPublisher refuses while err is set.
type failingPublisher struct {
	mu  sync.Mutex
	err error
}

func (p *failingPublisher) PublishResources(context.Context, slicepub.DriverResources) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// The driver is ready once its first complete set of slices reached the
// publisher, and not while the publisher refuses them.
func TestReadyOncePublished(t *testing.T) {
	d, _ := newTestDriver(t, t.TempDir(), Options{Sources: 1})
	pub := &failingPublisher{err: errors.New("controller not started")}
	d.SetPublisher(context.Background(), pub)
	var mu sync.Mutex
	var why []string
	d.UseReadiness(func(w string) {
		mu.Lock()
		why = append(why, w)
		mu.Unlock()
	})
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		return why[len(why)-1]
	}
	if w := last(); !strings.Contains(w, "waiting for the GPUs and every NIC pool") {
		t.Fatalf("before anything reported: %q", w)
	}
	d.SetGPUs(context.Background(), testGPUs())
	if w := last(); !strings.Contains(w, "publishing ResourceSlices: controller not started") {
		t.Fatalf("publisher refusing: %q", w)
	}
	pub.mu.Lock()
	pub.err = nil
	pub.mu.Unlock()
	d.SetGPUs(context.Background(), testGPUs())
	if w := last(); w != "" {
		t.Fatalf("published: %q, want ready", w)
	}
}
