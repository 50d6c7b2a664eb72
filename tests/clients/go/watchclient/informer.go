package main

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// runInformer runs a SharedIndexInformer on pods (the real reflector, DeltaFIFO and indexer)
// and reports every handler call. No resync period: a SYNC line can only come from a relist.
func runInformer(ctx context.Context, client kubernetes.Interface, namespace, selector string, out *output) error {
	pods := client.CoreV1().Pods(namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector
			return pods.Watch(ctx, opts)
		},
	}
	informer := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	// The reflector calls this whenever its list or watch fails, before it backs off; a 410
	// here means the informer itself had to relist (watchproxy should have hidden that).
	err := informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		l := line{Type: "WATCH_ERROR", Error: err.Error()}
		var status apierrors.APIStatus
		if errors.As(err, &status) {
			l.Code = status.Status().Code
		}
		out.write(l)
	})
	if err != nil {
		return err
	}
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, initial bool) {
			l := out.object("ADDED", obj)
			l.Initial = initial
			out.write(l)
		},
		UpdateFunc: func(oldObj, newObj interface{}) {
			kind := "MODIFIED"
			if rv(oldObj) == rv(newObj) {
				kind = "SYNC"
			}
			out.write(out.object(kind, newObj))
		},
		DeleteFunc: func(obj interface{}) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				l := out.object("DELETED", tomb.Obj)
				l.Tombstone = true
				out.write(l)
				return
			}
			out.write(out.object("DELETED", obj))
		},
	})
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		informer.RunWithContext(ctx)
	}()
	// reg.HasSynced also waits until this handler has been given every object of the first
	// list, so READY comes after the last initial ADDED line.
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		<-done
		if ctx.Err() != nil {
			return nil // stopped before the first sync (SIGTERM or --duration)
		}
		return fmt.Errorf("informer never synced")
	}
	out.write(line{Type: "READY"})
	<-done
	return nil
}

func rv(obj interface{}) string {
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return m.GetResourceVersion()
}
