"""Node-local mode for real: the Helm chart's DaemonSet rolled out by the controller manager, and
tenant pods on the node that reach it as docs/deploying.md ("Node-local mode") says: by the
Service, whose ``internalTrafficPolicy: Local`` kube-proxy (iptables mode) honours.

Two releases of the chart run side by side for the whole module (one rollout): ``watchproxy``
with the chart's defaults (``security.identity: serviceaccount``), and ``watchproxy-forward``
with ``security.identity: forward`` and ``rbac.create=false`` (its own ServiceAccount may read
nothing, so whatever a tenant reads through it, the tenant's own token was allowed to).

One difference from a cluster: the tier runs no cluster DNS, so a tenant pod resolves the
documented server name, ``<release>.watchproxy-system.svc``, through its ``hostAliases``, which
map that name to the Service's ClusterIP: the address a DNS server would answer. The ClusterIP is
on no interface; only kube-proxy's rules take a connection to it anywhere. Everything else is as
documented: the chart as ``helm template`` renders it, the namespace label, the tenant kubeconfig
from ``watchproxy kubeconfig``, ``KUBECONFIG``. The bridge CNI plugin enforces no NetworkPolicy:
the chart's policy is applied, not tested.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.tools import find_tool
from tests.realapi.fixture import ci_requires_tier
from tests.realnode.cluster import KUBECTL, Cluster, LineStream
from tests.realnode.conftest import MEASURED
from tests.realnode.node import NODE_NAME, Node, run, wait_until

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "watchproxy-system"
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
RELEASES = {
    "watchproxy": [],
    "watchproxy-forward": [
        "--set", "config.security.identity=forward", "--set", "rbac.create=false",
    ],
}  # fmt: skip


@dataclass(frozen=True)
class Proxy:
    """One release's DaemonSet pod on the node and its Service."""

    release: str
    pod: str
    pod_ip: str
    cluster_ip: str

    @property
    def server_name(self) -> str:
        return f"{self.release}.{SYSTEM}.svc"

    @property
    def server(self) -> str:
        return f"http://{self.server_name}:8001"


def render(helm: str, release: str, extra: list[str]) -> str:
    return subprocess.run(
        [helm, "template", release, str(REPO / "deploy" / "helm" / "watchproxy"),
         "--namespace", SYSTEM, "--kube-version", "1.37.2", *extra],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip


@pytest.fixture(scope="module")
def proxies(node: Node) -> Iterator[dict[str, Proxy]]:
    """Both releases applied as ``helm template`` renders them, rolled out by the controller
    manager and the scheduler onto the node (kubectl's rollout status watches the DaemonSet)."""
    helm = find_tool("helm")
    if helm is None:
        if ci_requires_tier():
            pytest.fail("CI=true and helm is missing (scripts/tools.sh builds it)")
        pytest.skip("helm not found (scripts/tools.sh builds it into ~/.cache/watchproxy-tools)")
    cluster = Cluster(node)
    # (helm install reads the version from the cluster; helm template is told it.)
    rendered = "\n---\n".join(render(helm, r, extra) for r, extra in RELEASES.items())
    cluster.kubectl("create", "namespace", SYSTEM)
    try:
        began = time.monotonic()
        cluster.kubectl("apply", "-n", SYSTEM, "-f", "-", stdin=rendered)
        found = {}
        for release in RELEASES:
            rollout = cluster.kubectl(
                "rollout", "status", "-n", SYSTEM, f"daemonset/{release}", "--timeout=90s",
                timeout=95, check=False,
            )  # fmt: skip
            if rollout.returncode != 0:
                events = cluster.kubectl("get", "events", "-n", SYSTEM, check=False)
                logs = cluster.kubectl(
                    "logs", "-n", SYSTEM, f"daemonset/{release}", "--previous", check=False
                )
                raise AssertionError(
                    f"{rollout.stderr.decode()}\n{events.stdout.decode()[-3000:]}\n"
                    f"{logs.stdout.decode()[-3000:]}{logs.stderr.decode()[-3000:]}"
                )
            selector = f"app.kubernetes.io/instance={release}"
            (pod,) = cluster.get("pods", "-n", SYSTEM, "-l", selector)["items"]
            service = cluster.get("service", "-n", SYSTEM, release)
            assert pod["spec"]["nodeName"] == NODE_NAME
            # Ready is not yet reachable by the Service: the EndpointSlice controller and
            # kube-proxy's next sync follow (a tenant connecting in between is refused:
            # kube-proxy rejects a Service with no endpoints).
            node.wait_service_routing(f"{SYSTEM}/{release}:api", timeout=30)
            found[release] = Proxy(
                release, pod["metadata"]["name"], pod["status"]["podIP"],
                service["spec"]["clusterIP"],
            )  # fmt: skip
        MEASURED["node-local: apply to both releases reachable by their Services (s)"] = round(
            time.monotonic() - began, 1
        )
        yield found
    finally:
        cluster.kubectl(
            "delete", "-n", SYSTEM, "-f", "-", "--wait=false", stdin=rendered, check=False
        )
        cluster.kubectl("delete", "namespace", SYSTEM, "--wait=false", check=False)


def admin_get(cluster: Cluster, proxy: Proxy, path: str) -> str:
    """GET on the proxy's admin port from inside its pod: /debug/watches answers loopback
    clients only (admin.debug_view: loopback)."""
    code = (
        "import urllib.request; print(urllib.request.urlopen("
        f"'http://127.0.0.1:8081{path}', timeout=10).read().decode())"
    )
    return cluster.kubectl(
        "exec", "-n", SYSTEM, proxy.pod, "--", "python3", "-c", code
    ).stdout.decode()


def shared_watches(cluster: Cluster, proxy: Proxy, path: str) -> list[dict[str, Any]]:
    """The proxy's shared watches of the collection at ``path``, from its debug view."""
    watches = json.loads(admin_get(cluster, proxy, "/debug/watches"))["watches"]
    return [w for w in watches if w["key"]["path"] == path]


@pytest.fixture
def tenant_namespace(node: Node, tmp_path: Path) -> Iterator[Callable[[list[str]], str]]:
    """Makes a namespace admitted by the chart's NetworkPolicy, with the tenant kubeconfig that
    ``watchproxy kubeconfig <args>`` writes in the ConfigMap the docs name; deletes it after
    the test (its tenants would otherwise go on watching while later tests run)."""
    cluster = Cluster(node)
    made: list[str] = []

    def make(kubeconfig_args: list[str]) -> str:
        namespace = f"nl-{secrets.token_hex(3)}"
        made.append(namespace)
        cluster.create_namespace(namespace)
        cluster.kubectl("label", "namespace", namespace, "watchproxy-client=true")
        kubeconfig = subprocess.run(
            [str(REPO / ".venv" / "bin" / "watchproxy"), "kubeconfig", *kubeconfig_args],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        (tmp_path / "config").write_text(kubeconfig, encoding="utf-8")
        cluster.kubectl(
            "create", "configmap", "watchproxy-kubeconfig", "-n", namespace,
            f"--from-file=config={tmp_path / 'config'}",
        )  # fmt: skip
        return namespace

    yield make
    for namespace in made:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


WATCH_SCRIPT = (
    'echo "tenant: started"; '
    'exec kubectl --namespace "$POD_NAMESPACE" get configmaps --watch --no-headers '
    "-o custom-columns=NAME:.metadata.name,RV:.metadata.resourceVersion"
)


def tenant(
    name: str, proxy: Proxy, script: str = WATCH_SCRIPT, service_account: str | None = None
) -> dict[str, Any]:
    """A tenant pod as docs/deploying.md describes it: ``KUBECONFIG`` from the ConfigMap, the
    server name resolved (``hostAliases``, for the DNS this tier lacks) to the Service's
    ClusterIP. With ``service_account``, its token is mounted (``security.identity: forward``)."""
    spec: dict[str, Any] = {
        "automountServiceAccountToken": service_account is not None,
        "terminationGracePeriodSeconds": 1,
        "hostAliases": [{"ip": proxy.cluster_ip, "hostnames": [proxy.server_name]}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "tenant",
                "image": "wprn-app:1",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "env": [
                    {"name": "KUBECONFIG", "value": "/etc/watchproxy/config"},
                    {"name": "SERVER", "value": proxy.server},
                    {
                        "name": "POD_NAMESPACE",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                    },
                ],
                "volumeMounts": [{"name": "kubeconfig", "mountPath": "/etc/watchproxy"}],
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
        "volumes": [{"name": "kubeconfig", "configMap": {"name": "watchproxy-kubeconfig"}}],
    }
    if service_account is not None:
        spec["serviceAccountName"] = service_account
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"tenant": name}},
        "spec": spec,
    }


def wait_ready(cluster: Cluster, namespace: str, *pods: str) -> None:
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", *(f"pod/{p}" for p in pods),
        "--timeout=60s", timeout=65,
    )  # fmt: skip


def await_line(
    cluster: Cluster, namespace: str, pod: str, matches: Callable[[str], bool]
) -> list[str]:
    """The pod's output up to the first line that ``matches`` (``kubectl logs -f``)."""
    command = [KUBECTL, "--kubeconfig", cluster.kubeconfig, "logs", "-f", "-n", namespace, pod]
    with LineStream(command) as stream:
        return stream.wait_for(lambda ls: any(map(matches, ls)), 30, f"a line from {pod}")


def await_event(cluster: Cluster, namespace: str, pod: str, name: str, rv: str) -> None:
    """The tenant printed the configmap ``name`` at resourceVersion ``rv``."""
    await_line(cluster, namespace, pod, lambda line: line.split() == [name, rv])


def upstream_watches(node: Node, namespace: str) -> list[tuple[str, str]]:
    """Which ServiceAccounts watched configmaps in ``namespace`` at the apiserver, by its audit
    log: (user, the pod its token was bound to). The kubelet's watches of the ConfigMaps its
    pods mount and the tests' own (kubectl wait, as the admin) are not ServiceAccounts'."""
    found = []
    for event in node.audit_events(namespace):
        user = event["user"]
        if event["verb"] != "watch" or event["stage"] != "ResponseStarted":
            continue
        if not user["username"].startswith("system:serviceaccount:"):
            continue
        (pod,) = user["extra"]["authentication.kubernetes.io/pod-name"]
        found.append((user["username"], pod))
    return sorted(found)


def test_tenants_reach_the_daemonset_by_its_service_and_share_one_upstream_watch(
    node: Node, proxies: dict[str, Proxy], tenant_namespace: Callable[[list[str]], str]
) -> None:
    cluster = Cluster(node)
    proxy = proxies["watchproxy"]
    # The ClusterIP is no address of the node's: a connection to it goes anywhere only
    # through kube-proxy's DNAT, here to the one local endpoint (internalTrafficPolicy: Local
    # gives the Service a chain of local endpoints only).
    assert f"inet {proxy.cluster_ip}/" not in run(["ip", "-n", node.name, "-o", "addr"])
    assert (
        cluster.get("service", "-n", SYSTEM, proxy.release)["spec"]["internalTrafficPolicy"]
        == "Local"
    )
    nat = node.iptables_rules("nat")
    local_chain = re.search(
        rf"-A KUBE-SERVICES -d {re.escape(proxy.cluster_ip)}/32 .* -j (KUBE-SVL-\S+)", nat
    )
    assert local_chain, nat
    assert f"--to-destination {proxy.pod_ip}:8001" in nat

    namespace = tenant_namespace(["--server", proxy.server])
    cluster.apply([tenant("tenant-a", proxy), tenant("tenant-b", proxy)], namespace)
    wait_ready(cluster, namespace, "tenant-a", "tenant-b")
    cluster.kubectl("create", "configmap", "shared", "-n", namespace)
    rv = cluster.get("configmap", "-n", namespace, "shared")["metadata"]["resourceVersion"]
    for name in ("tenant-a", "tenant-b"):
        await_event(cluster, namespace, name, "shared", rv)
    # One upstream watch, as the proxy's ServiceAccount, for both tenants' identical watches
    # (kubectl prints a list's items before its watch starts: the second subscriber may be a
    # moment behind the event).
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    watches: list[dict[str, Any]] = []

    def both_subscribed() -> bool:
        watches[:] = shared_watches(cluster, proxy, path)
        return [w["subscribers"] for w in watches] == [2]

    try:
        wait_until(both_subscribed, timeout=10, what="both tenants' subscriptions", step=0.2)
    except TimeoutError as error:
        raise AssertionError(f"{error}: {watches}") from None
    (watch,) = watches
    assert watch["key"]["identity"] == "proxy"
    # Upstream: its one LIST and its one WATCH, never opened again.
    assert (watch["upstreamAttempts"], watch["relists"]) == (2, 0)
    # The apiserver's record agrees: one watch of the tenants' configmaps, as the proxy's
    # ServiceAccount with its pod's token (the tenants have none in this mode).
    account = f"system:serviceaccount:{SYSTEM}:watchproxy"
    assert upstream_watches(node, namespace) == [(account, proxy.pod)]
    status = cluster.kubectl(
        "exec", "-n", SYSTEM, proxy.pod, "--", "cat", "/proc/1/status"
    ).stdout.decode()
    rss = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    assert rss
    MEASURED["node-local proxy RSS, two tenants' shared watch (MiB)"] = round(
        int(rss.group(1)) / 1024, 1
    )


CONNECT = """
import socket, sys
for address in sys.argv[1:]:
    try:
        with socket.create_connection((address, 8001), timeout=2) as s:
            s.sendall(b"GET /version HTTP/1.1\\r\\nHost: localhost\\r\\n\\r\\n")
            print(address, s.recv(100).split(b"\\r\\n")[0].decode())
    except OSError as error:
        print(address, "failed:", type(error).__name__)
"""


def test_internal_traffic_policy_local_never_sends_a_tenant_to_another_nodes_proxy(
    node: Node, proxies: dict[str, Proxy], namespace: str
) -> None:
    """docs/deploying.md: with no ready proxy pod on its node, a tenant's connection fails
    instead of crossing nodes. Two Services without a selector name the same proxy pod as their
    one endpoint, declared on another node: kube-proxy sends the ``Cluster`` one there, and
    drops the ``Local`` one's traffic."""
    cluster = Cluster(node)
    proxy = proxies["watchproxy"]
    objects: list[dict[str, Any]] = []
    for name, policy in (("elsewhere-local", "Local"), ("elsewhere-cluster", "Cluster")):
        objects += [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name},
                "spec": {
                    "internalTrafficPolicy": policy,
                    "ports": [{"name": "api", "port": 8001, "protocol": "TCP"}],
                },
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {"name": name, "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "ports": [{"name": "api", "port": 8001, "protocol": "TCP"}],
                "endpoints": [
                    {
                        "addresses": [proxy.pod_ip],
                        "nodeName": "another-node",
                        "conditions": {"ready": True},
                    }
                ],
            },
        ]
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "prober"},
            "spec": {
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 1,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 1000,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "prober",
                        "image": "wprn-app:1",
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "infinity"],
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
            },
        }
    )
    cluster.apply(objects, namespace)
    local_ip, cluster_ip = (
        cluster.get("service", "-n", namespace, n)["spec"]["clusterIP"]
        for n in ("elsewhere-local", "elsewhere-cluster")
    )
    # kube-proxy's next sync: the Cluster Service's DNAT, and its verdict on the Local one.
    verdict = f'"{namespace}/elsewhere-local:api has no local endpoints"'
    wait_until(
        lambda: (
            verdict in node.iptables_rules("filter")
            and f'"{namespace}/elsewhere-cluster:api cluster IP"' in node.iptables_rules("nat")
        ),
        timeout=30,
        what="kube-proxy's rules for the two Services",
        step=0.2,
    )
    wait_ready(cluster, namespace, "prober")
    answers = cluster.kubectl(
        "exec", "-n", namespace, "prober", "--", "python3", "-c", CONNECT, cluster_ip, local_ip,
    ).stdout.decode().splitlines()  # fmt: skip
    # The Cluster Service reaches the proxy (an HTTP answer from its API port); the Local
    # one's SYN is dropped by that rule, so the client's connect times out.
    assert answers[0].startswith(f"{cluster_ip} HTTP/1.1 "), answers
    assert answers[1] == f"{local_ip} failed: TimeoutError", answers


# What the tenant kubeconfig of forward mode means (`watchproxy kubeconfig --token-file`), done
# by a client that honours it over http (Python's, as the official Python client does; kubectl
# and client-go do not: see the test). A list, then a watch from its resourceVersion.
READER_SCRIPT = """
import json, os, urllib.request
token = open("/var/run/secrets/kubernetes.io/serviceaccount/token").read()
base = os.environ["SERVER"] + "/api/v1/namespaces/" + os.environ["POD_NAMESPACE"] + "/configmaps"
def get(url):
    headers = {"Authorization": "Bearer " + token, "Accept": "application/json"}
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=600)
with get(base) as response:
    rv = json.load(response)["metadata"]["resourceVersion"]
print("listed", rv, flush=True)
with get(base + "?watch=1&resourceVersion=" + rv) as stream:
    for line in stream:
        meta = json.loads(line)["object"]["metadata"]
        print(meta["name"], meta["resourceVersion"], flush=True)
"""
STRANGER_SCRIPT = """
import json, os, urllib.error, urllib.request
token = open("/var/run/secrets/kubernetes.io/serviceaccount/token").read()
namespace = os.environ["POD_NAMESPACE"]
for verb, query in (("LIST", ""), ("WATCH", "?watch=1&timeoutSeconds=5")):
    request = urllib.request.Request(
        os.environ["SERVER"] + f"/api/v1/namespaces/{namespace}/configmaps{query}",
        headers={"Authorization": "Bearer " + token, "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            print(verb, response.status, json.dumps(None), flush=True)
    except urllib.error.HTTPError as error:
        print(verb, error.code, json.dumps(json.loads(error.read())), flush=True)
"""


def apiserver_answer(node: Node, path: str, user: str) -> tuple[int, Any]:
    """The apiserver's own answer to ``user`` for ``path``: the admin impersonating it (the
    apiserver adds a ServiceAccount user's groups itself)."""
    headers = {"Authorization": f"Bearer {node.token}", "Impersonate-User": user}
    request = urllib.request.Request(node.url + path, headers=headers)
    context = ssl.create_default_context(cafile=node.ca_file)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_forward_identity_forwards_each_tenants_own_token_and_shares_nothing_across_them(
    node: Node, proxies: dict[str, Proxy], tenant_namespace: Callable[[list[str]], str]
) -> None:
    cluster = Cluster(node)
    proxy = proxies["watchproxy-forward"]
    namespace = tenant_namespace(["--server", proxy.server, "--token-file", TOKEN_FILE])
    # ServiceAccount "app" may read configmaps here (Cluster.create_namespace); "stranger" has
    # no binding at all. The proxy's own ServiceAccount has none either (rbac.create=false).
    cluster.kubectl("create", "serviceaccount", "stranger", "-n", namespace)
    cluster.apply(
        [
            tenant("reader-1", proxy, f"exec python3 -c '{READER_SCRIPT}'", "app"),
            tenant("reader-2", proxy, f"exec python3 -c '{READER_SCRIPT}'", "app"),
            tenant(
                "stranger",
                proxy,
                f"python3 -c '{STRANGER_SCRIPT}'; exec sleep infinity",
                service_account="stranger",
            ),
        ],
        namespace,
    )
    wait_ready(cluster, namespace, "reader-1", "reader-2", "stranger")
    # The configmap comes after both lists, so that it reaches each reader by its watch.
    for name in ("reader-1", "reader-2"):
        await_line(cluster, namespace, name, lambda line: line.startswith("listed "))
    cluster.kubectl("create", "configmap", "mine", "-n", namespace)
    rv = cluster.get("configmap", "-n", namespace, "mine")["metadata"]["resourceVersion"]
    for name in ("reader-1", "reader-2"):
        await_event(cluster, namespace, name, "mine", rv)

    # Each reader's watch runs upstream under its own credential: one shared watch per token
    # (the kubelet projects a token per pod), keyed by the digest of that pod's own header.
    digests = {}
    for name in ("reader-1", "reader-2"):
        token = cluster.kubectl("exec", "-n", namespace, name, "--", "cat", TOKEN_FILE).stdout
        digests[name] = "sha256:" + hashlib.sha256(b"Bearer " + token).hexdigest()[:16]
    watches = shared_watches(cluster, proxy, f"/api/v1/namespaces/{namespace}/configmaps")
    assert sorted(w["key"]["identity"] for w in watches) == sorted(digests.values())
    assert [w["subscribers"] for w in watches] == [1, 1]
    # And at the apiserver: two watches, each authenticated as the reader's ServiceAccount by
    # the token the kubelet bound to that reader's pod.
    reader = f"system:serviceaccount:{namespace}:app"
    assert upstream_watches(node, namespace) == [(reader, "reader-1"), (reader, "reader-2")]

    # The stranger's own token went upstream: the apiserver's 403 for that ServiceAccount,
    # the same Status the apiserver gives it directly; for the watch, the hub asked the
    # apiserver first (a SelfSubjectAccessReview with the stranger's token) and answers with
    # the apiserver's Status for it. Neither came from the readers' watches.
    lines = await_line(cluster, namespace, "stranger", lambda line: line.startswith("WATCH "))
    answers = {}
    for line in lines:
        if line.startswith(("LIST ", "WATCH ")):
            verb, code, body = line.split(" ", 2)
            answers[verb] = (int(code), json.loads(body))
    user = f"system:serviceaccount:{namespace}:stranger"
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    assert answers["LIST"] == apiserver_answer(node, path, user)
    assert answers["WATCH"] == apiserver_answer(node, path + "?watch=1", user)
    assert answers["WATCH"][0] == 403
    assert answers["WATCH"][1]["reason"] == "Forbidden"
    assert f'User "{user}" cannot watch resource "configmaps"' in answers["WATCH"][1]["message"]
    assert len(shared_watches(cluster, proxy, path)) == 2
    # The apiserver saw the stranger's own token once: its LIST, refused. Its watch never went
    # upstream (the review refused it first), and no reader's watch was opened for it.
    strangers = [
        (event["verb"], event["responseStatus"]["code"])
        for event in node.audit_events(namespace)
        if event["user"]["username"] == user
    ]
    assert strangers == [("list", 403)]
    assert upstream_watches(node, namespace) == [(reader, "reader-1"), (reader, "reader-2")]

    # kubectl (client-go) reads the same kubeconfig but sends no credential to an http://
    # server (clientcmd reads a user's credentials only for TLS): through forward mode it acts
    # as system:anonymous. docs/deploying.md says so.
    done = cluster.kubectl(
        "exec", "-n", namespace, "reader-1", "--", "kubectl", "get", "configmaps", "-v=8",
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    log = done.stderr.decode()
    assert "Authorization" not in log  # -v=8 shows the request headers (a token as <masked>)
    assert 'User \\"system:anonymous\\" cannot get path \\"/api\\"' in log
