// Command conformance runs Kubernetes' own e2e specs of the API (test/e2e/apimachinery, and the
// auth and instrumentation specs) from the k8s.io/kubernetes release in go.mod against one
// apiserver, for watchproxy's conformance tier (tests/realapi/test_conformance.py).
//
// test/e2e's own suite setup waits for schedulable nodes and running system pods; kubetestenv
// has neither (no kubelet, no controller-manager), so this program carries a setup of its own:
// the framework's flags (-kubeconfig, -provider, ...), a BeforeSuite that only asks the apiserver
// for its version and the cluster's IP family, and a compact JSON report of every spec that was
// not filtered out (-report). Ginkgo's flags work as in e2e.test (-ginkgo.focus, -ginkgo.skip,
// -ginkgo.seed, -ginkgo.junit-report, ...); the order of the specs is random for a seed and the
// same for the same seed, so a run direct and one through watchproxy meet the specs in the
// same order.
//
//	conformance -kubeconfig K -ginkgo.focus 'Watchers' -ginkgo.seed 1 -report out.json
//
// Exit status: 0 when every spec that ran passed (or was skipped by the spec itself), 1 when
// one failed, 2 for a usage error.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"
	utilnet "k8s.io/utils/net"

	// The spec packages. apimachinery imports apps and scheduling, so their specs register too
	// (the tier's focus keeps them out: they need nodes and controllers).
	_ "k8s.io/kubernetes/test/e2e/apimachinery"
	_ "k8s.io/kubernetes/test/e2e/auth"
	_ "k8s.io/kubernetes/test/e2e/instrumentation"

	// Feature names frozen as in e2e.test, client-go's auth plugins, klog's flags.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	_ "k8s.io/component-base/logs/testinit"
	_ "k8s.io/kubernetes/test/e2e/feature"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"
)

// specResult is one line of the -report file; field names are the contract with
// tests/conformance/results.py.
type specResult struct {
	Name     string  `json:"name"`
	State    string  `json:"state"`
	Failure  string  `json:"failure,omitempty"`
	Location string  `json:"location,omitempty"`
	Seconds  float64 `json:"seconds"`
}

type report struct {
	Seed     int64        `json:"seed"`
	Started  string       `json:"started"`
	Seconds  float64      `json:"seconds"`
	Host     string       `json:"host"`
	Specs    []specResult `json:"specs"`
	Complete bool         `json:"complete"`
}

var reportPath string

// suiteT is the GinkgoTestingT of a program that is not a `go test` binary.
type suiteT struct{ failed bool }

func (t *suiteT) Fail() { t.failed = true }

func main() {
	flag.StringVar(&reportPath, "report", "", "write a JSON report of every spec that ran to this file")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	// Defaults for an apiserver without a controller-manager: nothing creates a namespace's
	// "default" service account or its kube-root-ca.crt, which the framework otherwise awaits
	// in every spec's namespace. A flag on the command line still wins.
	must(flag.CommandLine.Set("e2e-verify-service-account", "false"))
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "conformance: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}

	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)

	// As test/e2e does: klog through the framework, contextual logging on.
	logs.InitLogs()
	defer logs.FlushLogs()
	klog.EnableContextualLogging(true)
	gomega.RegisterFailHandler(framework.Fail)

	suiteConfig, reporterConfig := ginkgo.GinkgoConfiguration()
	suiteConfig.RandomizeAllSpecs = true
	t := &suiteT{}
	ginkgo.RunSpecs(t, "watchproxy conformance", suiteConfig, reporterConfig)
	if t.failed {
		os.Exit(1)
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// The suite's setup: reach the apiserver once (a wrong kubeconfig fails here, not in every
// spec) and learn the cluster's IP family as test/e2e does, from the "kubernetes" service.
var _ = ginkgo.BeforeSuite(func(ctx context.Context) {
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "loading the client configuration")
	version, err := c.Discovery().ServerVersion()
	framework.ExpectNoError(err, "asking the apiserver for its version")
	framework.Logf("kube-apiserver version: %s", version.GitVersion)
	framework.TestContext.IPFamily = "ipv4"
	svc, err := c.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		framework.Logf("no kubernetes service (%v): assuming IPv4", err)
	} else if utilnet.IsIPv6String(svc.Spec.ClusterIP) {
		framework.TestContext.IPFamily = "ipv6"
	}
})

var _ = ginkgo.ReportAfterSuite("watchproxy conformance report", func(r ginkgo.Report) {
	if reportPath == "" {
		return
	}
	out := report{
		Seed:     r.SuiteConfig.RandomSeed,
		Started:  r.StartTime.UTC().Format(time.RFC3339),
		Seconds:  r.RunTime.Seconds(),
		Host:     framework.TestContext.Host,
		Specs:    []specResult{},
		Complete: !r.SuiteConfig.DryRun && r.SpecialSuiteFailureReasons == nil,
	}
	for _, spec := range r.SpecReports {
		if spec.LeafNodeType != types.NodeTypeIt {
			continue
		}
		// A spec the focus or skip left out is "skipped" after no attempt; a spec that
		// skipped itself (e2eskipper) was attempted and says why in its failure message.
		if spec.State == types.SpecStateSkipped && spec.NumAttempts == 0 {
			continue
		}
		result := specResult{
			Name:    spec.FullText(),
			State:   spec.State.String(),
			Seconds: spec.RunTime.Seconds(),
		}
		if spec.State != types.SpecStatePassed {
			result.Failure = strings.TrimSpace(spec.Failure.Message)
			if spec.Failure.Location.FileName != "" {
				result.Location = spec.Failure.Location.String()
			}
		}
		out.Specs = append(out.Specs, result)
	}
	data, err := json.MarshalIndent(out, "", " ")
	framework.ExpectNoError(err)
	// Written whole under another name and renamed: a reader never sees half a report.
	partial := reportPath + ".partial"
	framework.ExpectNoError(os.WriteFile(partial, append(data, '\n'), 0o644))
	framework.ExpectNoError(os.Rename(partial, reportPath))
})
