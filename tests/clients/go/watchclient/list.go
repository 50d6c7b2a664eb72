package main

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"
)

// runList lists the pods once with client-go's ListPager (what a reflector's relist uses),
// pageSize objects per request: one ITEM line per pod in the order received, then a LISTED
// line with the list's resourceVersion. The pager follows the continue tokens itself.
func runList(ctx context.Context, client kubernetes.Interface, namespace, selector string, pageSize int64, out *output) error {
	pods := client.CoreV1().Pods(namespace)
	p := pager.New(pager.SimplePageFunc(func(opts metav1.ListOptions) (runtime.Object, error) {
		opts.LabelSelector = selector
		return pods.List(ctx, opts)
	}))
	p.PageSize = pageSize
	listed, _, err := p.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	err = meta.EachListItem(listed, func(obj runtime.Object) error {
		out.write(out.object("ITEM", obj.(*corev1.Pod)))
		return nil
	})
	if err != nil {
		return err
	}
	accessor, err := meta.ListAccessor(listed)
	if err != nil {
		return err
	}
	out.write(line{Type: "LISTED", ResourceVersion: accessor.GetResourceVersion()})
	return nil
}
