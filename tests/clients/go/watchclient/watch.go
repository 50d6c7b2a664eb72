package main

import (
	"context"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// runWatch is a reflector without the list: it watches from "now" (the server sends the
// current objects as ADDED), re-watches from the last resourceVersion it saw whenever a stream
// ends, and relists only when told that resourceVersion is gone (410).
func runWatch(ctx context.Context, client kubernetes.Interface, namespace, selector string, timeout time.Duration, out *output) error {
	w := &watcher{
		pods:      client.CoreV1().Pods(namespace),
		namespace: namespace,
		selector:  selector,
		timeout:   timeout,
		out:       out,
		known:     map[string]string{},
	}
	return w.run(ctx)
}

type podClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

type watcher struct {
	pods      podClient
	namespace string
	selector  string
	timeout   time.Duration
	out       *output
	rv        string            // where the next watch starts ("" at first: from now)
	known     map[string]string // name -> resourceVersion of what this client holds
	ready     bool
}

const (
	retryInitial = 200 * time.Millisecond
	retryMax     = 2 * time.Second
)

func (w *watcher) run(ctx context.Context) error {
	delay := retryInitial
	for ctx.Err() == nil {
		expired, err := w.watchOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if expired {
			err = w.relist(ctx)
		}
		if err == nil {
			delay = retryInitial
			continue // a stream that ended cleanly is resumed at once, as a reflector does
		}
		w.out.write(errorLine(err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, retryMax)
	}
	return nil
}

// watchOnce runs one watch to its end; expired says the server no longer has w.rv.
func (w *watcher) watchOnce(ctx context.Context) (expired bool, err error) {
	opts := metav1.ListOptions{
		LabelSelector:       w.selector,
		ResourceVersion:     w.rv,
		AllowWatchBookmarks: true,
	}
	if w.timeout > 0 {
		seconds := int64(w.timeout / time.Second)
		opts.TimeoutSeconds = &seconds
	}
	stream, err := w.pods.Watch(ctx, opts)
	if err != nil {
		return apierrors.IsResourceExpired(err) || apierrors.IsGone(err), err
	}
	defer stream.Stop()
	if !w.ready {
		w.ready = true
		w.out.write(line{Type: "READY"})
	}
	for {
		select {
		case <-ctx.Done():
			return false, nil
		case event, ok := <-stream.ResultChan():
			if !ok {
				return false, nil
			}
			if event.Type == watch.Error {
				status := apierrors.FromObject(event.Object)
				code := int32(0)
				if s, ok := status.(apierrors.APIStatus); ok {
					code = s.Status().Code
				}
				w.out.write(line{Type: "ERROR", Code: code, Error: status.Error()})
				return code == 410, nil
			}
			w.handle(event)
		}
	}
}

func (w *watcher) handle(event watch.Event) {
	m, err := meta.Accessor(event.Object)
	if err != nil {
		w.out.write(line{Type: "ERROR", Error: "event without metadata: " + err.Error()})
		return
	}
	w.rv = m.GetResourceVersion()
	switch event.Type {
	case watch.Deleted:
		delete(w.known, m.GetName())
	case watch.Added, watch.Modified:
		w.known[m.GetName()] = m.GetResourceVersion()
	}
	w.out.write(w.out.object(string(event.Type), event.Object))
}

// relist lists the pods and reports how they differ from what this client holds, as an
// informer's relist would: ADDED/MODIFIED for new or changed objects, DELETED (at the list's
// resourceVersion) for vanished ones. The RELIST line says it happened.
func (w *watcher) relist(ctx context.Context) error {
	list, err := w.pods.List(ctx, metav1.ListOptions{LabelSelector: w.selector})
	if err != nil {
		return err
	}
	listRV := list.ResourceVersion
	w.out.write(line{Type: "RELIST", ResourceVersion: listRV})
	seen := make(map[string]bool, len(list.Items))
	for i := range list.Items {
		pod := &list.Items[i]
		seen[pod.Name] = true
		old, had := w.known[pod.Name]
		switch {
		case !had:
			w.out.write(w.out.object("ADDED", pod))
		case old != pod.ResourceVersion:
			w.out.write(w.out.object("MODIFIED", pod))
		}
		w.known[pod.Name] = pod.ResourceVersion
	}
	var gone []string
	for name := range w.known {
		if !seen[name] {
			gone = append(gone, name)
		}
	}
	sort.Strings(gone)
	for _, name := range gone {
		delete(w.known, name)
		w.out.write(line{Type: "DELETED", Namespace: w.namespace, Name: name, ResourceVersion: listRV})
	}
	w.rv = listRV
	return nil
}

func errorLine(err error) line {
	l := line{Type: "WATCH_ERROR", Error: err.Error()}
	if s, ok := err.(apierrors.APIStatus); ok {
		l.Code = s.Status().Code
	}
	return l
}
