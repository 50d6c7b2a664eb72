// Command watchclient is a real client-go program that the watchproxy test suite runs through
// the proxy. It watches pods and writes every event it receives (or every informer handler
// call) as one JSON line, so the tests can compare what a real client saw with the apiserver's
// own record of changes.
//
//	watchclient --mode informer [--protobuf | --content-type json|protobuf|default] [--namespace NS] [--selector app=x]
//	watchclient --mode watch --selector app=x [--watch-timeout 3]
//
// It reads KUBECONFIG (or --kubeconfig), stops cleanly on SIGTERM or SIGINT, or after
// --duration, and exits 0 unless it could not start.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

const protobuf = "application/vnd.kubernetes.protobuf"

type options struct {
	mode         string
	protobuf     bool
	contentType  string
	namespace    string
	selector     string
	out          string
	kubeconfig   string
	duration     time.Duration
	watchTimeout time.Duration
	pageSize     int64
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.mode, "mode", "informer", "informer (SharedIndexInformer), watch (plain Watch loop) or list (one ListPager list)")
	flag.Int64Var(&o.pageSize, "page-size", 500, "list mode: objects per page (client-go's default is 500)")
	flag.StringVar(&o.contentType, "content-type", "json", "json, protobuf ("+protobuf+" with JSON as the fallback) or default (client-go's own choice)")
	flag.BoolVar(&o.protobuf, "protobuf", false, "the same as --content-type=protobuf")
	flag.StringVar(&o.namespace, "namespace", "", "namespace to watch (default: the kubeconfig context's, else default)")
	flag.StringVar(&o.selector, "selector", "", "label selector")
	flag.StringVar(&o.out, "out", "", "write JSON lines to this file instead of stdout")
	flag.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig path")
	flag.DurationVar(&o.duration, "duration", 0, "stop after this long (0: until SIGTERM)")
	flag.DurationVar(&o.watchTimeout, "watch-timeout", 0, "watch mode: timeoutSeconds of each watch (0: none)")
	klog.InitFlags(flag.CommandLine) // -v=6 shows every request client-go makes
	flag.Parse()
	return o
}

func main() {
	o := parseFlags()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "watchclient:", err)
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

	cfg, namespace, err := loadConfig(o)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	switch o.mode {
	case "informer":
		return runInformer(ctx, client, namespace, o.selector, out)
	case "watch":
		return runWatch(ctx, client, namespace, o.selector, o.watchTimeout, out)
	case "list":
		return runList(ctx, client, namespace, o.selector, o.pageSize, out)
	default:
		return fmt.Errorf("unknown --mode %q (informer, watch or list)", o.mode)
	}
}

func loadConfig(o options) (*rest.Config, string, error) {
	if o.kubeconfig == "" {
		return nil, "", errors.New("no kubeconfig: set KUBECONFIG or --kubeconfig")
	}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: o.kubeconfig},
		&clientcmd.ConfigOverrides{},
	)
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, "", err
	}
	namespace := o.namespace
	if namespace == "" {
		if namespace, _, err = loader.Namespace(); err != nil {
			return nil, "", err
		}
	}
	if o.protobuf {
		o.contentType = "protobuf"
	}
	switch o.contentType {
	case "json":
		cfg.ContentType = "application/json"
	case "protobuf":
		cfg.ContentType = protobuf
		cfg.AcceptContentTypes = protobuf + ",application/json"
	case "default":
		// Left unset, client-go's typed clients for built-in types (pods included) ask for
		// protobuf on their own (gentype.PrefersProtobuf): what most Go controllers send.
	default:
		return nil, "", fmt.Errorf("unknown --content-type %q (json, protobuf or default)", o.contentType)
	}
	cfg.UserAgent = "watchproxy-test-watchclient/" + o.mode
	return cfg, namespace, nil
}
