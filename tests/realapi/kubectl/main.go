// kubectl of the Kubernetes release that go.mod pins (1.37), built from Go modules like
// kubetestenv: the newest kubectl, which no package on this machine ships, for the realapi
// tier's kubectl tests. It is kubectl's own command tree; only the entry point is here.
package main

import (
	"os"

	// The client auth plugins a kubeconfig may name (exec, oidc), as the release binary has.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
	os.Exit(0)
}
