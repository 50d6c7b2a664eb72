"""The aiohttp application: authentication, fault and stats middleware, and the routes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from . import discovery, openapi
from .context import BASE_HEADERS, ServerContext
from .errors import ApiError, MethodNotAllowed, NotFound, Unauthorized
from .handlers import ResourceHandlers, json_response
from .paths import GroupVersionPath, parse_api_path
from .stats import RequestRecord, now

HEALTH_PATHS = ("/healthz", "/readyz", "/livez")
PUBLIC_PATHS = (*HEALTH_PATHS, "/version", "/version/")
MAX_BODY = 3 * 1024 * 1024  # the apiserver's request body limit
USER = "default"  # the service account the token is (in namespace default)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def status_response(request: web.Request, err: ApiError) -> web.Response:
    return web.Response(
        body=json.dumps(err.status()).encode(),
        status=err.code,
        content_type="application/json",
        headers={**request.get(BASE_HEADERS, {}), **err.headers},
    )


def _is_watch(request: web.Request) -> bool:
    # apimachinery's booleans: false only for "0" and "false" in any case.
    value = request.query.get("watch")
    return "/watch/" in request.path or not (value is None or value.lower() in ("0", "false"))


def build_app(ctx: ServerContext) -> web.Application:
    resources = ResourceHandlers(ctx)

    @web.middleware
    async def edge(request: web.Request, handler: Handler) -> web.StreamResponse:
        ctx.stats.record_request(
            RequestRecord(
                request.method,
                request.path,
                request.query_string,
                dict(request.headers),
                now(),
                _is_watch(request),
            )
        )
        request[BASE_HEADERS] = {
            "Audit-Id": str(uuid.uuid4()),
            "Cache-Control": "no-cache, private",
            "X-Kubernetes-Pf-Flowschema-Uid": "00000000-0000-4000-8000-000000000001",
            "X-Kubernetes-Pf-Prioritylevel-Uid": "00000000-0000-4000-8000-000000000002",
        }
        ctx.stats.request_started()
        try:
            outage = ctx.faults.outage_error()
            if outage is not None:
                raise outage
            auth = request.headers.get("Authorization")
            if (auth is not None or request.path not in PUBLIC_PATHS) and auth != (
                f"Bearer {ctx.token}"
            ):
                raise Unauthorized("Unauthorized")
            if request.path not in HEALTH_PATHS:
                injected = ctx.faults.request_error()
                if injected is not None:
                    raise injected
                async with ctx.faults.serving(long_running=_is_watch(request)):
                    return await handler(request)
            return await handler(request)
        except ApiError as err:
            return status_response(request, err)
        except web.HTTPMethodNotAllowed:
            return status_response(request, MethodNotAllowed("method not allowed"))
        except web.HTTPNotFound:
            return status_response(
                request, NotFound("the server could not find the requested resource")
            )
        except web.HTTPRequestEntityTooLarge:
            too_large = ApiError("the request body is too large")
            too_large.code, too_large.reason = 413, "RequestEntityTooLarge"
            return status_response(request, too_large)
        finally:
            ctx.stats.request_finished()

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok", content_type="text/plain")

    async def version(request: web.Request) -> web.Response:
        return json_response(request, discovery.version_info())

    async def api_root(request: web.Request) -> web.Response:
        return json_response(request, discovery.api_versions(ctx.server_address))

    async def apis_root(request: web.Request) -> web.Response:
        return json_response(request, discovery.api_group_list())

    async def api_path(request: web.Request) -> web.StreamResponse:
        parts = request.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in discovery.GROUPS:
            return json_response(request, discovery.api_group(parts[1]))
        parsed = parse_api_path(request.path)
        if isinstance(parsed, GroupVersionPath):
            doc = discovery.api_resource_list(parsed.group, parsed.version)
            if doc is None:
                raise NotFound("the server could not find the requested resource")
            return json_response(request, doc)
        return await resources.dispatch(request, parsed)

    async def openapi_v3(request: web.Request) -> web.Response:
        gv = request.match_info.get("gv", "")
        doc = openapi.group_version_doc(gv) if gv else openapi.root_doc()
        if doc is None:
            raise NotFound("the server could not find the requested resource")
        return json_response(request, doc)

    async def access_review(request: web.Request) -> web.Response:
        # SelfSubjectAccessReview: allowed unless faults.forbid() names the resource.
        review = await request.json()
        attributes = review.get("spec", {}).get("resourceAttributes", {})
        resource = attributes.get("resource", "")
        if attributes.get("subresource"):
            resource += "/" + attributes["subresource"]
        allowed = ctx.faults.allows(resource)
        review["status"] = {"allowed": allowed} if allowed else {"allowed": False, "reason": ""}
        return json_response(request, review, status=201)

    async def whoami(request: web.Request) -> web.Response:
        # SelfSubjectReview: the one user kubefake knows, as the 403s of faults.forbid name it.
        user = {"username": f"system:serviceaccount:default:{USER}", "groups": []}
        answer = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "SelfSubjectReview",
            "metadata": {},
            "status": {"userInfo": user},
        }
        return json_response(request, answer, status=201)

    async def not_found(request: web.Request) -> web.Response:
        raise NotFound("the server could not find the requested resource")

    app = web.Application(middlewares=[edge], client_max_size=MAX_BODY)
    for path in HEALTH_PATHS:
        app.router.add_get(path, health)
    # A real apiserver serves these with one trailing slash too (some clients ask so).
    for suffix in ("", "/"):
        app.router.add_get("/version" + suffix, version)
        app.router.add_get("/api" + suffix, api_root)
        app.router.add_get("/apis" + suffix, apis_root)
    app.router.add_post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", access_review)
    app.router.add_post("/apis/authentication.k8s.io/v1/selfsubjectreviews", whoami)
    app.router.add_route("*", "/api/{tail:.+}", api_path)
    app.router.add_route("*", "/apis/{tail:.+}", api_path)
    app.router.add_get("/openapi/v3", openapi_v3)
    app.router.add_get("/openapi/v3/{gv:.+}", openapi_v3)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app
