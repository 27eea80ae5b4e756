package computedomain

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/workqueue"
)

// Run reconciles every ComputeDomain when it changes, and all of them
// every resync (so a node's heartbeat ages into NodeLost), until ctx ends.
func (c *Controller) Run(ctx context.Context, resync time.Duration) error {
	f := dynamicinformer.NewDynamicSharedInformerFactory(c.o.Dynamic, resync)
	inf := f.ForResource(GVR).Informer()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			q.Add(k)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	for {
		key, quit := q.Get()
		if quit {
			return nil
		}
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		if err := c.Reconcile(ctx, ns, name); err != nil {
			c.o.Log.Warn("ComputeDomain: reconcile failed; retrying", "domain", key, "err", err)
			q.AddRateLimited(key)
		} else {
			q.Forget(key)
		}
		q.Done(key)
	}
}

// Leader is the Lease the controller's replicas share.
type Leader struct {
	Namespace, Name, Identity string
	LeaseDuration             time.Duration
}

// RunLeader runs the controller while it holds the Lease; it returns when
// ctx ends, or with ErrNotLeader when the lease is lost (the process then
// exits and starts over, as client-go advises).
func (c *Controller) RunLeader(ctx context.Context, l Leader, resync time.Duration) error {
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, l.Namespace, l.Name,
		c.o.Kube.CoreV1(), c.o.Kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: l.Identity})
	if err != nil {
		return fmt.Errorf("compute-domain-controller: lease %s/%s: %w", l.Namespace, l.Name, err)
	}
	if l.LeaseDuration <= 0 {
		l.LeaseDuration = 15 * time.Second
	}
	lost := make(chan struct{})
	runErr := make(chan error, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, Name: l.Name,
		LeaseDuration: l.LeaseDuration, RenewDeadline: l.LeaseDuration * 2 / 3, RetryPeriod: l.LeaseDuration / 7,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				c.o.Log.Info("compute-domain-controller: leading", "lease", l.Namespace+"/"+l.Name, "identity", l.Identity)
				runErr <- c.Run(ctx, resync)
			},
			OnStoppedLeading: func() { close(lost) },
		},
	})
	if err != nil {
		return fmt.Errorf("compute-domain-controller: %w", err)
	}
	le.Run(ctx)
	select {
	case err := <-runErr:
		if err != nil {
			return err
		}
	default:
	}
	if ctx.Err() != nil {
		return nil
	}
	<-lost
	return ErrNotLeader
}
