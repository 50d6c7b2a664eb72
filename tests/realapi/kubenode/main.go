// kubenode: the node half of a single-node Kubernetes for the realnode test tier
// (tests/realnode): kubelet, kube-controller-manager, kube-scheduler and kube-proxy of the same
// release as kubetestenv (the control plane's apiserver + etcd), in one program, chosen by its
// first argument:
//
//	kubenode kubelet --config=...
//	kubenode kube-controller-manager --kubeconfig=...
//	kubenode kube-scheduler --kubeconfig=...
//	kubenode kube-proxy --config=...
//
// One program rather than four: on two cores each link of a binary this size takes a minute,
// and the four share nearly all of their packages (as hyperkube did until Kubernetes 1.19).
// It lives in kubetestenv's module so that the two builds share go.mod's pinned versions and
// Go's build cache.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	commands := map[string]func() *cobra.Command{
		"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
		"kube-controller-manager": controllermanager.NewControllerManagerCommand,
		"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
		"kube-proxy":              proxy.NewProxyCommand,
	}
	if len(os.Args) < 2 || commands[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: kubenode kubelet|kube-controller-manager|kube-scheduler|kube-proxy [flags]")
		os.Exit(2)
	}
	command := commands[os.Args[1]]()
	// cobra reads os.Args[1:]; the component's own flags follow its name.
	command.SetArgs(os.Args[2:])
	os.Exit(cli.Run(command))
}
