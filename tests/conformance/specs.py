"""Which of Kubernetes' e2e specs the conformance tier runs, which it skips and why, and which
cannot pass through watchproxy and why.

Spec names are ginkgo's full text: the container texts and the spec's own, joined by spaces,
with the labels the e2e framework writes into them (``[Conformance]``, ``[Serial]``, ...).
Patterns are regular expressions that mean the same to Go's RE2 (ginkgo's ``-focus`` and
``-skip``) and to Python's ``re``.

kubetestenv is one kube-apiserver and etcd: no kubelet (so no node, and no pod ever runs), no
controller-manager (so no garbage collector, namespace, quota, service-account, token or
certificate-signing controller), no scheduler. A spec that needs one of them cannot pass
direct, so it is skipped below with the reason; so are specs for features a default
apiserver leaves off.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

SEED = 1206
"""ginkgo's seed for both runs (the order of the specs), unless CONFORMANCE_SEED."""


@dataclass(frozen=True)
class Selection:
    """The specs a run takes: those matching one of ``areas`` and none of ``skips``."""

    areas: tuple[str, ...]
    skips: Mapping[str, str]
    """Pattern -> why the specs it matches cannot pass on kubetestenv, even direct."""

    @property
    def focus(self) -> str:
        return "|".join(f"(?:{area})" for area in self.areas)

    @property
    def skip(self) -> str:
        return "|".join(f"(?:{pattern})" for pattern in self.skips)

    @cached_property
    def area_patterns(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(area) for area in self.areas)

    def takes(self, name: str) -> bool:
        """Whether ginkgo would run the spec ``name`` (for tests of the lists themselves)."""
        return any(p.search(name) for p in self.area_patterns) and not any(
            re.search(pattern, name) for pattern in self.skips
        )


API_MACHINERY = r"\[sig-api-machinery\] "

NEEDS_PODS = "no kubelet: a pod never runs"
NEEDS_CONTROLLERS = "no controller-manager"

SKIPS: dict[str, str] = {
    # Labels.
    r"\[Disruptive\]": "restarts or breaks cluster components",
    r"\[Flaky\]": "marked flaky upstream",
    r"\[Feature:": "needs a feature the cluster must be set up for (e2e.test skips these too)",
    r"\[Alpha\]|\[Feature:OffByDefault\]": "a feature gate a default apiserver leaves off",
    r"\[MinimumKubeletVersion:": f"{NEEDS_PODS} (tests the kubelet)",
    # sig-api-machinery.
    r"\[sig-api-machinery\] AdmissionWebhook ": f"{NEEDS_PODS}: the webhook server is a pod",
    r"\[sig-api-machinery\] CustomResourceConversionWebhook ": (
        f"{NEEDS_PODS}: the conversion webhook is a pod"
    ),
    r"\[sig-api-machinery\] CustomResourceFieldSelectors ": (
        f"{NEEDS_PODS}: the conversion webhook is a pod"
    ),
    r"\[sig-api-machinery\] Aggregator ": f"{NEEDS_PODS}: the sample-apiserver is a deployment",
    r"OpenAPIV3 should contain OpenAPI V3 for Aggregated APIServer": (
        f"{NEEDS_PODS}: the sample-apiserver is a deployment"
    ),
    r"client-go should negotiate .*sample-apiserver|1\.17 sample-apiserver": (
        f"{NEEDS_PODS}: the sample-apiserver is a deployment"
    ),
    r"\[sig-api-machinery\] Garbage collector ": f"{NEEDS_CONTROLLERS}: the garbage collector",
    r"\[sig-api-machinery\] ResourceQuota ": (
        f"{NEEDS_CONTROLLERS}: the quota controller computes status.used"
    ),
    r"\[sig-api-machinery\] Namespaces .*(removed when a namespace is deleted|delete fast"
    r"|delete pod first)": f"{NEEDS_CONTROLLERS}: the namespace controller empties namespaces",
    r"\[sig-api-machinery\] OrderedNamespaceDeletion ": (
        f"{NEEDS_CONTROLLERS} and {NEEDS_PODS}: namespace deletion with pods"
    ),
    r"Generated clientset should create pods": f"{NEEDS_PODS}: waits for a running pod",
    r"\[sig-api-machinery\] ValidatingAdmissionPolicy .*should type check": (
        f"{NEEDS_CONTROLLERS}: the policy status controller writes the type check"
    ),
    r"Servers with support for Table transformation .* for nodes": "no node to list",
    # sig-auth.
    r"\[sig-auth\] Certificates API .*should support building a client with a CSR": (
        f"{NEEDS_CONTROLLERS}: the CSR signer issues the certificate"
    ),
    r"\[sig-auth\] NodeAuthenticator ": f"{NEEDS_PODS}: talks to the kubelet",
    r"\[sig-auth\] ServiceAccounts should (mount|allow opting out|set ownership|support "
    r"InClusterConfig)": f"{NEEDS_PODS}: the token is checked inside a pod",
    r"ServiceAccountIssuerDiscovery": f"{NEEDS_PODS}: the discovery client is a pod",
    r"\[sig-auth\] ServiceAccounts no secret-based service account token": (
        f"{NEEDS_CONTROLLERS}: the service-account controller makes the namespace's default"
    ),
    r"\[sig-auth\] ServiceAccounts should guarantee kube-root-ca\.crt": (
        f"{NEEDS_CONTROLLERS}: the root CA publisher"
    ),
    r"\[sig-auth\] ValidatingAdmissionPolicy can restrict access by-node": (
        "needs nodes: each node updates its own object"
    ),
    # sig-instrumentation.
    r"\[sig-instrumentation\] Metrics ": f"{NEEDS_PODS}: scrapes the kubelet",
    r"\[sig-instrumentation\] MetricsGrabber should grab all metrics from a Kubelet": (
        "no node to scrape"
    ),
}

SUBSET = Selection(
    areas=(
        rf"{API_MACHINERY}Watchers ",
        rf"{API_MACHINERY}Servers with support for API chunking ",
        rf"{API_MACHINERY}Servers with support for Table transformation ",
        rf"{API_MACHINERY}CustomResourceDefinition Watch ",
        rf"{API_MACHINERY}API Streaming \(aka\. WatchList\) ",
        rf"{API_MACHINERY}FieldValidation ",
        rf"{API_MACHINERY}ServerSideApply ",
    ),
    skips={
        **SKIPS,
        r"\[Slow\]": "waits for an etcd compaction (chunking): the full set runs it",
    },
)
"""What the README's test command runs: the specs about watches and lists, and a few about
writes (field validation, server-side apply), in a few minutes."""

FULL = Selection(
    areas=(r"\[sig-api-machinery\] ", r"\[sig-auth\] ", r"\[sig-instrumentation\] "),
    skips=SKIPS,
)
"""CONFORMANCE=full: every spec of the three packages that an apiserver alone can
pass."""

IMPERSONATION_REFUSED = (
    "impersonates another user (Impersonate-* headers), which watchproxy refuses with 403 under"
    " its default security.impersonation: refuse (docs/security.md)"
)

# "[sig-auth] SubjectReview should support SubjectReview API operations" passes through
# watchproxy, though not as it passes direct: it expects its impersonated LIST to be forbidden
# as the SubjectAccessReview said, and watchproxy's own 403 (impersonation refused) is what it
# gets, not RBAC's.
THROUGH_WATCHPROXY: dict[str, str] = {
    # Its impersonated requests get watchproxy's 403, without the priority level's UID header
    # the spec looks for.
    "[sig-api-machinery] API priority and fairness should ensure that requests can be"
    " classified by adding FlowSchema and PriorityLevelConfiguration": IMPERSONATION_REFUSED,
    # Asks who it is while impersonating jane-doe: watchproxy answers 403 first.
    "[sig-auth] SelfSubjectReview should support SelfSubjectReview API operations": (
        IMPERSONATION_REFUSED
    ),
}
"""Full spec name -> why it cannot pass through watchproxy in its default configuration,
though it passes direct: what watchproxy means to do differently."""

# None left: the four specs that failed through watchproxy on a gzip watch-list (a member
# without a sync flush, which Go's reader holds back on a quiet collection) pass since the fix.
KNOWN_BUGS: dict[str, str] = {}
"""Full spec name -> the watchproxy bug that makes it fail through watchproxy. Unlike
THROUGH_WATCHPROXY, each entry is to go: when the fix lands, the spec passes, the tier says the
entry is stale, and it is deleted."""


def listed() -> dict[str, str]:
    """Every spec excused from passing through watchproxy, with the reason."""
    return {**THROUGH_WATCHPROXY, **KNOWN_BUGS}
