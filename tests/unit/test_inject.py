"""watchproxy.inject, the pure manifest transformation behind `watchproxy inject`."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchproxy import inject

NAMES = st.sampled_from(["app", "web", "watchproxy", "KUBECONFIG", "watchproxy-kubeconfig", "x"])


def container(name: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "image": f"{name}:1", **more}


def deployment(spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "web"}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"spec": spec}},
    }


named_items = st.lists(
    st.builds(lambda n, v: {"name": n, "value": v}, NAMES, st.text(max_size=3)), max_size=4
)
mounts = st.lists(
    st.builds(lambda n, p: {"name": n, "mountPath": p}, NAMES, st.sampled_from(["/a", "/b"])),
    max_size=3,
)
containers = st.lists(
    st.builds(lambda n, e, m: container(n, env=e, volumeMounts=m), NAMES, named_items, mounts),
    min_size=1,
    max_size=3,
)
pod_specs = st.builds(
    lambda c, i, v: {"containers": c, "initContainers": i, "volumes": v},
    containers,
    st.lists(st.builds(container, NAMES), max_size=3),
    st.lists(st.builds(lambda n: {"name": n, "emptyDir": {}}, NAMES), max_size=4),
)


@settings(max_examples=100, deadline=None)
@given(pod_specs, st.sampled_from([None, "a", "b"]))
def test_injecting_twice_is_injecting_once(spec: dict[str, Any], namespace: str | None) -> None:
    docs = [deployment(spec, namespace)]
    before = copy.deepcopy(docs)
    once = inject.inject_documents(docs)
    assert docs == before, "the input is not modified"
    assert inject.inject_documents(once) == once


@settings(max_examples=100, deadline=None)
@given(pod_specs)
def test_every_container_gets_one_kubeconfig_and_one_mount(spec: dict[str, Any]) -> None:
    (_, _, result) = inject.inject_documents([deployment(spec)])
    pod = result["spec"]["template"]["spec"]
    init = pod["initContainers"]
    assert init[0] == inject.sidecar_container()
    assert [c["name"] for c in init].count("watchproxy") == 1
    for volume in inject.sidecar_volumes():
        assert [v for v in pod["volumes"] if v["name"] == volume["name"]] == [volume]
    assert len(pod["containers"]) == len(spec["containers"])
    for c in pod["containers"]:
        assert [e for e in c["env"] if e["name"] == "KUBECONFIG"] == [inject.app_env()]
        mounts = [m for m in c["volumeMounts"] if m["name"] == inject.KUBECONFIG_VOLUME]
        assert mounts == [inject.app_mount()]


def test_upsert_replaces_in_place_and_keeps_the_rest() -> None:
    spec = {
        "containers": [
            container(
                "app",
                env=[{"name": "A", "value": "1"}, {"name": "KUBECONFIG", "value": "/old"}],
            )
        ],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }
    (_, _, result) = inject.inject_documents([deployment(spec)])
    app = result["spec"]["template"]["spec"]["containers"][0]
    assert app["env"] == [{"name": "A", "value": "1"}, inject.app_env()]
    assert result["spec"]["template"]["spec"]["volumes"][0] == {"name": "data", "emptyDir": {}}


def test_image_is_the_callers() -> None:
    (_, _, result) = inject.inject_documents(
        [deployment({"containers": [container("app")]})], image="r.example/wp:9"
    )
    assert result["spec"]["template"]["spec"]["initContainers"][0]["image"] == "r.example/wp:9"


def test_configmaps_once_per_namespace_and_kept_when_present() -> None:
    spec = {"containers": [container("app")]}
    own = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": inject.CONFIG_MAP, "namespace": "b"},
        "data": {"config.yaml": "listen: {port: 9001}\n"},
    }
    docs = [deployment(spec, "a"), deployment(spec, "a"), deployment(spec, "b"), own]
    result = inject.inject_documents(docs)
    added = [(o["metadata"].get("namespace"), o["metadata"]["name"]) for o in result[:3]]
    assert added == [
        ("a", inject.CONFIG_MAP),
        ("a", inject.KUBECONFIG_MAP),
        ("b", inject.KUBECONFIG_MAP),
    ]
    assert result[-1] == own


def test_unknown_kinds_and_other_groups_pass_through() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}}
    # A CRD that happens to be called Deployment is not apps/v1's.
    custom = deployment({"containers": [container("app")]})
    custom["apiVersion"] = "example.com/v1"
    assert inject.inject_documents([service, custom]) == [service, custom]


def test_cronjob_and_list_items_are_injected() -> None:
    cronjob = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "c"},
        "spec": {
            "schedule": "* * * * *",
            "jobTemplate": {"spec": {"template": {"spec": {"containers": [container("c")]}}}},
        },
    }
    items = {"apiVersion": "v1", "kind": "List", "items": [cronjob]}
    (_, _, result) = inject.inject_documents([items])
    spec = result["items"][0]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["name"] == "watchproxy"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (deployment({"containers": []}), "containers is missing or empty"),
        (deployment({"containers": "app"}), "containers must be a list"),
        (deployment({"containers": ["app"]}), "containers[0] must be a mapping"),
        ({"apiVersion": "apps/v1", "kind": "DaemonSet", "spec": {}}, "spec.template is missing"),
        ({"kind": "Pod"}, "has no apiVersion"),
        ("text", "document 1 is not a Kubernetes object"),
        ({"apiVersion": "v1", "kind": "List", "items": [1]}, "item 1 of the List"),
    ],
)
def test_malformed_workloads_are_named(doc: Any, message: str) -> None:
    with pytest.raises(inject.InjectError, match=message.replace("[", r"\[")):
        inject.inject_documents([doc])


def test_json_and_yaml_streams_parse() -> None:
    assert inject.parse_manifests('{"kind": "A"}') == [{"kind": "A"}]
    assert inject.parse_manifests('[{"kind": "A"}, {"kind": "B"}]') == [
        {"kind": "A"},
        {"kind": "B"},
    ]
    assert inject.parse_manifests("kind: A\n---\nkind: B\n---\n") == [
        {"kind": "A"},
        {"kind": "B"},
        None,
    ]
    # Flow-style YAML that is not JSON still parses.
    assert inject.parse_manifests("{kind: A}") == [{"kind": "A"}]


def test_text_round_trip_is_stable() -> None:
    docs = [deployment({"containers": [container("app")]}, "a")]
    text = inject.dump_manifests(inject.inject_documents(docs))
    assert "config.yaml: |" in text, "multi-line strings in block style"
    assert inject.dump_manifests(inject.inject_documents(inject.parse_manifests(text))) == text


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
            "Pod p: a bare Pod is not injected; put it in a Deployment, Job or another workload",
        ),
        (
            deployment({"hostNetwork": True, "containers": [container("app")]}),
            "spec.hostNetwork is true: watchproxy's API port would be open to the whole node",
        ),
        (
            deployment({"containers": [container("app", ports=[{"containerPort": 8001}])]}),
            "containers[0] (app) uses port 8001, watchproxy's wp-api port",
        ),
        (
            deployment(
                {
                    "initContainers": [container("metrics", ports=[{"containerPort": 8081}])],
                    "containers": [container("app")],
                }
            ),
            "initContainers[0] (metrics) uses port 8081, watchproxy's wp-admin port",
        ),
    ],
)
def test_pods_whose_network_or_kind_cannot_take_the_sidecar_are_refused(
    doc: Any, message: str
) -> None:
    with pytest.raises(inject.InjectError) as caught:
        inject.inject_documents([doc])
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_replaced_kubeconfig_and_an_unknown_namespace_are_warned_about_once() -> None:
    own = container("app", env=[{"name": "KUBECONFIG", "value": "/own/kubeconfig"}])
    warnings: list[str] = []
    once = inject.inject_documents([deployment({"containers": [own]})], warn=warnings.append)
    no_namespace = (
        "a workload without metadata.namespace: its kubeconfig names no namespace, so clients "
        "in it use 'default' (set metadata.namespace to the one it runs in)"
    )
    assert warnings == [
        "Deployment web: spec.template.spec.containers[0] (app): its KUBECONFIG "
        "(/own/kubeconfig) is replaced by watchproxy's (/var/run/watchproxy/kubeconfig)",
        no_namespace,
    ]
    warnings.clear()
    inject.inject_documents([once[-1]], warn=warnings.append)  # its KUBECONFIG is ours now
    assert warnings == [no_namespace]


def test_the_kubeconfig_names_the_workloads_namespace() -> None:
    result = inject.inject_documents([deployment({"containers": [container("app")]}, "shop")])
    kubeconfig = next(o for o in result if o["metadata"]["name"] == inject.KUBECONFIG_MAP)
    text = kubeconfig["data"][inject.KUBECONFIG_KEY]
    assert kubeconfig["metadata"]["namespace"] == "shop"
    assert "namespace: shop" in text
