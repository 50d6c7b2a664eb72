"""Resource endpoints: GET, LIST, WATCH, POST, PUT, PATCH, DELETE, and the status, scale and
log subresources. Errors are raised as ApiError and turned into Status answers by the app."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from typing import Any

import yaml
from aiohttp import web

from . import patch as patches
from .context import BASE_HEADERS, CUT, OpenStream, ServerContext
from .errors import BadRequest, MethodNotAllowed, NotFound, UnsupportedMediaType
from .listing import list_objects
from .options import ListOptions, decode_list_options
from .paths import ApiPath
from .remote import exec_websocket
from .resources import ResourceType
from .selectors import FieldSelector, Filter, LabelSelector
from .spdyserver import exec_spdy, port_forward
from .store import Obj, rfc3339
from .table import METADATA, TABLE, negotiate, partial_metadata, partial_metadata_list, to_table
from .validation import check_body, prepare_create, prepare_update, validate
from .watch import serve_watch


def json_response(request: web.Request, obj: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(obj, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
        headers=request.get(BASE_HEADERS, {}),
    )


# A Go duration, as the apiserver parses the request deadline (``timeout``) of short requests.
_GO_DURATION = re.compile(r"[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)")


def _check_request_timeout(request: web.Request) -> None:
    value = request.query.get("timeout")
    if value is not None and not _GO_DURATION.fullmatch(value):
        raise BadRequest(
            f'invalid timeout specified in the request URL - time: invalid duration "{value}"'
        )


def _list_options(request: web.Request, path: ApiPath) -> ListOptions | None:
    """The decoded ListOptions where the apiserver reads them: GET or DELETE on a collection,
    GET on a legacy /watch/ path. A GET of one object ignores them (``?watch=1`` included)."""
    if path.subresource is not None:
        return None
    if request.method == "GET" and (path.name is None or path.legacy_watch):
        return decode_list_options(request.query, force_watch=path.legacy_watch)
    if request.method == "DELETE" and path.name is None and not path.legacy_watch:
        return decode_list_options(request.query)
    return None


def _strip_type(obj: Obj) -> Obj:
    """List items carry no apiVersion/kind in the apiserver's JSON."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}


async def _read_body(request: web.Request, *, yaml_ok: bool = False) -> Any:
    if "protobuf" in request.content_type or "cbor" in request.content_type:
        raise UnsupportedMediaType(
            f"the body of the request was in an unknown format - accepted media types include: "
            f"application/json, application/yaml (not {request.content_type})"
        )
    raw = await request.read()
    if not raw:
        raise BadRequest("the request body is empty")
    try:
        if yaml_ok or request.content_type in ("application/yaml", "application/apply-patch+yaml"):
            return yaml.safe_load(raw)
        return json.loads(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise BadRequest(f"the body of the request could not be decoded: {exc}") from None


class ResourceHandlers:
    """The handlers of /api/v1/... and /apis/{group}/{version}/... resource paths."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    async def dispatch(self, request: web.Request, path: ApiPath) -> web.StreamResponse:
        method = request.method
        if path.subresource == "log":
            if method != "GET":
                raise MethodNotAllowed(f"the server does not allow this method: {method}")
            return await self.logs(request, path)
        if path.subresource == "scale":
            return await self.scale(request, path)
        if path.subresource in ("exec", "attach", "portforward"):
            assert path.name is not None
            self.ctx.store.get("pods", path.namespace, path.name)  # 404 for a missing pod
            self.ctx.faults.check_allowed(f"pods/{path.subresource}", path.name, path.namespace)
            if not request.headers.get("Upgrade"):
                raise BadRequest("Upgrade request required")
            if path.subresource == "portforward":
                return await port_forward(request)
            if request.headers.get("Upgrade", "").lower() == "spdy/3.1":
                return await exec_spdy(request)
            return await exec_websocket(request)
        options = _list_options(request, path)
        if options is not None and options.watch:
            return await self.watch(request, path, options)
        _check_request_timeout(request)  # only short requests have a deadline
        if method == "GET":
            if options is not None:
                await self.ctx.faults.before_list()
                return self.list(request, path, options)
            return self.get(request, path)
        if path.legacy_watch:
            raise MethodNotAllowed(f"the server does not allow this method: {method}")
        if method == "POST" and path.name is None:
            return await self.create(request, path)
        if path.name is None and method == "DELETE":
            return self.delete_collection(request, path)
        if path.name is not None:
            if method == "PUT":
                return await self.update(request, path)
            if method == "PATCH":
                return await self.patch(request, path)
            if method == "DELETE":
                return self.delete(request, path)
        raise MethodNotAllowed(
            f"the server does not allow this method on the requested resource: {method}"
        )

    # -- reads -----------------------------------------------------------------------------

    def _filter(self, request: web.Request, path: ApiPath) -> Filter:
        return Filter(
            path.namespace,
            LabelSelector.parse(request.query.get("labelSelector")),
            FieldSelector.parse(request.query.get("fieldSelector"), path.rt.field_labels),
        )

    def _present_one(self, request: web.Request, rt: ResourceType, obj: Obj) -> web.Response:
        rep = negotiate(request.headers.get("Accept"))
        if rep.kind == TABLE:
            meta = {"resourceVersion": obj["metadata"]["resourceVersion"]}
            include = request.query.get("includeObject", "Metadata")
            table = to_table(
                rt,
                [obj],
                now=time.time(),
                list_meta=meta,
                include_object=include,
                version=rep.version,
            )
            return json_response(request, table)
        if rep.kind == METADATA:
            return json_response(request, partial_metadata(obj, rep.version))
        return json_response(request, obj)

    def get(self, request: web.Request, path: ApiPath) -> web.Response:
        assert path.name is not None
        obj = self.ctx.store.get(path.rt.name, path.namespace, path.name)
        return self._present_one(request, path.rt, obj)

    def list(self, request: web.Request, path: ApiPath, options: ListOptions) -> web.Response:
        rep = negotiate(request.headers.get("Accept"))
        result = list_objects(
            self.ctx.store,
            path.rt.name,
            self._filter(request, path),
            limit=options.limit,
            continue_token=options.continue_token,
            resource_version=options.resource_version,
            rv_match=options.resource_version_match,
        )
        meta: dict[str, Any] = {"resourceVersion": str(result.resource_version)}
        if result.continue_token:
            meta["continue"] = result.continue_token
            meta["remainingItemCount"] = result.remaining
        if rep.kind == TABLE:
            include = request.query.get("includeObject", "Metadata")
            body = to_table(
                path.rt,
                result.items,
                now=time.time(),
                list_meta=meta,
                include_object=include,
                version=rep.version,
            )
        elif rep.kind == METADATA:
            body = partial_metadata_list(result.items, meta, rep.version)
        else:
            body = {
                "kind": path.rt.list_kind,
                "apiVersion": path.rt.api_version,
                "metadata": meta,
                "items": [_strip_type(o) for o in result.items],
            }
        return json_response(request, body)

    async def watch(
        self, request: web.Request, path: ApiPath, options: ListOptions
    ) -> web.StreamResponse:
        flt = self._filter(request, path)
        if path.name is not None:  # GET .../watch/.../pods/NAME is a watch on that name
            flt = Filter(
                flt.namespace, flt.labels, FieldSelector.parse(f"metadata.name={path.name}", ())
            )
        rep = negotiate(request.headers.get("Accept"))
        include = request.query.get("includeObject", "Metadata")
        return await serve_watch(
            request, self.ctx, path.rt, flt, rep, include, request.get(BASE_HEADERS, {}), options
        )

    # -- writes ----------------------------------------------------------------------------

    async def create(self, request: web.Request, path: ApiPath) -> web.Response:
        if path.subresource is not None:
            raise MethodNotAllowed(
                "the server does not allow this method on the requested resource"
            )
        body = check_body(path.rt, await _read_body(request))
        validate(path.rt, body)
        created = self.ctx.store.create(path.rt.name, path.namespace, prepare_create(path.rt, body))
        return json_response(request, created, 201)

    def _check_name(self, path: ApiPath, body: Obj) -> Obj:
        meta = body.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != path.name:
            raise BadRequest(
                f"the name of the object ({meta['name']}) does not match the name on the URL "
                f"({path.name})"
            )
        meta["name"] = path.name
        return body

    async def update(self, request: web.Request, path: ApiPath) -> web.Response:
        assert path.name is not None
        body = self._check_name(path, check_body(path.rt, await _read_body(request)))
        old = self.ctx.store.get(path.rt.name, path.namespace, path.name)
        new = prepare_update(path.rt, old, body, path.subresource)
        validate(path.rt, new)
        return json_response(request, self.ctx.store.update(path.rt.name, path.namespace, new))

    async def patch(self, request: web.Request, path: ApiPath) -> web.Response:
        assert path.name is not None
        content_type = request.content_type
        if content_type not in patches.PATCH_TYPES:
            patches.apply_patch(content_type, {}, {})  # raises UnsupportedMediaType
        body = await _read_body(request, yaml_ok=content_type == patches.APPLY)
        store = self.ctx.store
        if content_type == patches.APPLY:
            if not request.query.get("fieldManager"):
                raise BadRequest("PATCH requests for server-side apply require a fieldManager")
            body = self._check_name(path, check_body(path.rt, body))
            try:
                old = store.get(path.rt.name, path.namespace, path.name)
            except NotFound:
                if path.subresource is not None:
                    raise
                validate(path.rt, body)
                created = store.create(path.rt.name, path.namespace, prepare_create(path.rt, body))
                return json_response(request, created, 201)
        else:
            old = store.get(path.rt.name, path.namespace, path.name)
        patched = patches.apply_patch(content_type, old, body)
        if not isinstance(patched, dict):
            raise BadRequest("the patched object is not a JSON object")
        patched = self._check_name(path, check_body(path.rt, patched))
        new = prepare_update(path.rt, old, patched, path.subresource)
        validate(path.rt, new)
        return json_response(request, store.update(path.rt.name, path.namespace, new))

    def delete(self, request: web.Request, path: ApiPath) -> web.Response:
        assert path.name is not None
        if path.subresource is not None:
            raise MethodNotAllowed(
                "the server does not allow this method on the requested resource"
            )
        deleted = self.ctx.store.delete(path.rt.name, path.namespace, path.name)
        if path.rt.name in ("pods", "namespaces"):
            return json_response(request, deleted)
        return json_response(request, _success(path.rt, deleted))

    def delete_collection(self, request: web.Request, path: ApiPath) -> web.Response:
        flt = self._filter(request, path)
        store = self.ctx.store
        deleted = [
            store.delete(path.rt.name, o["metadata"].get("namespace"), o["metadata"]["name"])
            for o in store.list(path.rt.name, path.namespace)
            if flt.matches(o)
        ]
        body = {
            "kind": path.rt.list_kind,
            "apiVersion": path.rt.api_version,
            "metadata": {"resourceVersion": str(store.resource_version)},
            "items": [_strip_type(o) for o in deleted],
        }
        return json_response(request, body)

    # -- subresources ----------------------------------------------------------------------

    async def scale(self, request: web.Request, path: ApiPath) -> web.Response:
        assert path.name is not None
        store = self.ctx.store
        obj = store.get(path.rt.name, path.namespace, path.name)
        if request.method == "GET":
            return json_response(request, _scale_of(obj))
        if request.method not in ("PUT", "PATCH"):
            raise MethodNotAllowed(f"the server does not allow this method: {request.method}")
        body = await _read_body(request, yaml_ok=request.content_type == patches.APPLY)
        if request.method == "PATCH":
            body = patches.apply_patch(request.content_type, _scale_of(obj), body)
        if not isinstance(body, dict):
            raise BadRequest("the body of the request must be a JSON object")
        replicas = (body.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise BadRequest("spec.replicas must be a non-negative integer")
        obj["spec"]["replicas"] = replicas
        sent_rv = (body.get("metadata") or {}).get("resourceVersion")
        if sent_rv:
            obj["metadata"]["resourceVersion"] = sent_rv
        updated = store.update(path.rt.name, path.namespace, obj)
        return json_response(request, _scale_of(updated))

    async def logs(self, request: web.Request, path: ApiPath) -> web.StreamResponse:
        assert path.name is not None
        pod = self.ctx.store.get("pods", path.namespace, path.name)
        containers = [c.get("name", "") for c in pod.get("spec", {}).get("containers", [])]
        container = request.query.get("container") or (containers[0] if containers else "")
        if containers and container not in containers:
            raise BadRequest(f"container {container} is not valid for pod {path.name}")
        stamps = request.query.get("timestamps") in ("true", "1")

        def line(i: int) -> bytes:
            text = f"log line {i} from {path.namespace}/{path.name}/{container}\n"
            if stamps:
                text = rfc3339(time.time()).replace("Z", ".000000000Z") + " " + text
            return text.encode()

        if request.query.get("follow") not in ("true", "1"):
            tail_raw = request.query.get("tailLines")
            count = 5 if not tail_raw else max(0, min(5, int(tail_raw)))
            return web.Response(
                body=b"".join(line(i) for i in range(5 - count + 1, 6)),
                content_type="text/plain",
                headers=request.get(BASE_HEADERS, {}),
            )
        return await self._follow_logs(request, line)

    async def _follow_logs(self, request: web.Request, line: Any) -> web.StreamResponse:
        stream = OpenStream(request.transport, watch=False)
        resp = web.StreamResponse(
            headers={**request.get(BASE_HEADERS, {}), "Content-Type": "text/plain"}
        )
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        self.ctx.streams.add(stream)
        try:
            i = 1
            while True:
                await resp.write(line(i))
                i += 1
                try:
                    async with asyncio.timeout(self.ctx.log_interval):
                        if await stream.queue.get() is CUT:
                            return resp
                except TimeoutError:
                    pass
        except ConnectionError:
            return resp
        finally:
            self.ctx.streams.discard(stream)


def _success(rt: ResourceType, deleted: Obj) -> Obj:
    meta = deleted.get("metadata", {})
    details: dict[str, Any] = {"name": meta.get("name"), "kind": rt.name, "uid": meta.get("uid")}
    if rt.group:
        details["group"] = rt.group
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }


def _scale_of(obj: Obj) -> Obj:
    meta = obj["metadata"]
    labels: Mapping[str, str] = (obj.get("spec", {}).get("selector") or {}).get("matchLabels", {})
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {"replicas": obj.get("spec", {}).get("replicas", 1)},
        "status": {
            "replicas": obj.get("status", {}).get("replicas", 0),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        },
    }
