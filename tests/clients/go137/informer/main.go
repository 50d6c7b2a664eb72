// Command informer is a client-go v0.37 pod (or configmap) informer with client-go's defaults, run by the
// watchproxy tests through the proxy. Its defaults are the point: the informer comes from a
// SharedInformerFactory, so its reflector uses WatchList (one watch with sendInitialEvents=true,
// ended by a bookmark annotated k8s.io/initial-events-end) instead of LIST + WATCH, and its
// HTTP transport asks for gzip.
//
//	informer [--namespace NS] [--resource pods|configmaps] [--content-type json|default]
//	         [--out FILE] [--duration D]
//
// It writes one JSON line per informer handler call (ADDED with "initial", MODIFIED, DELETED,
// READY once synced, WATCH_ERROR) and, for JSON, one WIRE line per watch event as it came off
// the wire (type, resourceVersion, initialEventsEnd, the time in unix nanoseconds), and one
// WATCH line per watch request (its query, and whether the body came gzip-compressed). It
// reads KUBECONFIG (or --kubeconfig), stops on SIGTERM or SIGINT or after --duration, and
// exits 0 unless it could not start.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

type options struct {
	namespace   string
	resource    string
	contentType string
	out         string
	kubeconfig  string
	duration    time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.namespace, "namespace", "", "namespace to watch (default: the kubeconfig context's)")
	flag.StringVar(&o.resource, "resource", "pods", "pods or configmaps: the informer's resource")
	flag.StringVar(&o.contentType, "content-type", "json", "json (WIRE lines are written) or default (client-go's choice: protobuf)")
	flag.StringVar(&o.out, "out", "", "write JSON lines to this file instead of stdout")
	flag.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig path")
	flag.DurationVar(&o.duration, "duration", 0, "stop after this long (0: until SIGTERM)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "informer:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	out, err := openOutput(o.out)
	if err != nil {
		return err
	}
	defer out.Close()
	if o.kubeconfig == "" {
		return errors.New("no kubeconfig: set KUBECONFIG or --kubeconfig")
	}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: o.kubeconfig},
		&clientcmd.ConfigOverrides{},
	)
	cfg, err := loader.ClientConfig()
	if err != nil {
		return err
	}
	namespace := o.namespace
	if namespace == "" {
		if namespace, _, err = loader.Namespace(); err != nil {
			return err
		}
	}
	switch o.contentType {
	case "json":
		cfg.ContentType = "application/json"
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &wireTap{next: rt, out: out} })
	case "default":
	default:
		return fmt.Errorf("unknown --content-type %q (json or default)", o.contentType)
	}
	cfg.UserAgent = "watchproxy-test-informer/v0.37"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return runInformer(ctx, client, namespace, o.resource, out)
}

// runInformer runs the informer of a SharedInformerFactory for resource (pods or configmaps),
// as controllers get it, and reports every handler call.
func runInformer(ctx context.Context, client kubernetes.Interface, namespace, resource string, out *output) error {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace))
	var informer cache.SharedIndexInformer
	switch resource {
	case "pods":
		informer = factory.Core().V1().Pods().Informer()
	case "configmaps":
		informer = factory.Core().V1().ConfigMaps().Informer()
	default:
		return fmt.Errorf("unknown --resource %q (pods or configmaps)", resource)
	}
	err := informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// Stopped by the test: the reflector reports the watch it was in the middle of
			// opening as failed with the informer's own cancellation. Not the proxy's doing.
			return
		}
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
		AddFunc: func(obj any, initial bool) {
			l := objectLine("ADDED", obj)
			l.Initial = initial
			out.write(l)
		},
		UpdateFunc: func(oldObj, newObj any) {
			kind := "MODIFIED"
			if objectLine("", oldObj).ResourceVersion == objectLine("", newObj).ResourceVersion {
				kind = "SYNC"
			}
			out.write(objectLine(kind, newObj))
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				l := objectLine("DELETED", tomb.Obj)
				l.Tombstone = true
				out.write(l)
				return
			}
			out.write(objectLine("DELETED", obj))
		},
	})
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		if ctx.Err() != nil {
			return nil // stopped before the first sync
		}
		return errors.New("informer never synced")
	}
	out.write(line{Type: "READY"})
	<-ctx.Done()
	return nil
}
