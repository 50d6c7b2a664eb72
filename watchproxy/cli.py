"""Command line: ``watchproxy [run]``, ``watchproxy check-config``, ``watchproxy kubeconfig``,
``watchproxy inject``.

The demo (``scripts/demo.sh``: ``python -m kubefake.demo``) lives with the fake apiserver and
reuses the config flags and loop set-up from here; the product never imports the fake."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from watchproxy import __version__
from watchproxy.allocator import fix_mmap_threshold
from watchproxy.config import Config, ConfigError, build_config, load_file, read_env
from watchproxy.config.build import memory_budgets
from watchproxy.config.memory import container_limit, describe
from watchproxy.logs import setup_logging
from watchproxy.upstream.credentials import CredentialsError, UpstreamTarget, resolve_target

# Flags with a config key of their own; anything else goes through --set section.key=value.
FLAG_KEYS = {
    "listen_host": "listen.host",
    "listen_port": "listen.port",
    "admin_host": "admin.host",
    "admin_port": "admin.port",
    "kubeconfig": "upstream.kubeconfig",
    "context": "upstream.context",
    "log_level": "logging.level",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, except that a bad argument is one line (no usage block) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config file (default: $WATCHPROXY_CONFIG)")
    parser.add_argument("--listen-host", help="API listen address (listen.host)")
    parser.add_argument("--listen-port", help="API port (listen.port)")
    parser.add_argument("--admin-host", help="admin listen address (admin.host)")
    parser.add_argument("--admin-port", help="admin port (admin.port)")
    parser.add_argument("--kubeconfig", help="upstream kubeconfig (upstream.kubeconfig)")
    parser.add_argument("--context", help="kubeconfig context (upstream.context)")
    parser.add_argument("--log-level", help="debug, info, warning, error (logging.level)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="set any config key, e.g. --set hub.linger_seconds=10 (repeatable)",
    )


def parser() -> argparse.ArgumentParser:
    top = OneLineParser(
        prog="watchproxy",
        description="Sidecar proxy for the Kubernetes API: shared watches, rate limits, backoff.",
    )
    top.add_argument("--version", action="version", version=f"watchproxy {__version__}")
    sub = top.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run the proxy (the default command)")
    add_config_flags(run)
    check = sub.add_parser(
        "check-config", help="validate the config (file, environment, flags) and exit: 0 or 2"
    )
    add_config_flags(check)
    kubeconfig = sub.add_parser("kubeconfig", help="print a kubeconfig pointing at the proxy")
    kubeconfig.add_argument("--server", default=None, help="default: http://127.0.0.1:<port>")
    kubeconfig.add_argument("--listen-port", type=int, default=None)
    kubeconfig.add_argument("--namespace", default=None)
    kubeconfig.add_argument("--context-name", default="watchproxy")
    kubeconfig.add_argument(
        "--token-file",
        default=None,
        help="security.identity: forward only: the client's own token file (absolute path)",
    )
    inject = sub.add_parser("inject", help="add the watchproxy sidecar to workload manifests")
    inject.add_argument("-f", "--filename", required=True, help="YAML or JSON file, - for stdin")
    inject.add_argument("--image", default=None, help="sidecar image (default: watchproxy:VERSION)")
    return top


def run_inject(args: argparse.Namespace) -> int:
    """Read manifests, write them back with the sidecar added; bad input is one line, exit 2."""
    from watchproxy import inject

    source = "stdin" if args.filename == "-" else args.filename
    try:
        if args.filename == "-":
            text = sys.stdin.read()
        else:
            with open(args.filename, encoding="utf-8") as handle:
                text = handle.read()
        docs = inject.inject_documents(
            inject.parse_manifests(text, source),
            args.image or inject.DEFAULT_IMAGE,
            warn=lambda line: print(f"watchproxy inject: warning: {line}", file=sys.stderr),
        )
    except OSError as error:
        print(f"watchproxy inject: cannot read {source}: {error.strerror}", file=sys.stderr)
        return 2
    except UnicodeDecodeError:
        print(f"watchproxy inject: {source} is not UTF-8 text", file=sys.stderr)
        return 2
    except inject.InjectError as error:
        print(f"watchproxy inject: {error}", file=sys.stderr)
        return 2
    sys.stdout.write(inject.dump_manifests(docs))
    return 0


def config_path(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    path: str | None = args.config or env.get("WATCHPROXY_CONFIG")
    return path


def flag_overrides(args: argparse.Namespace) -> dict[str, str]:
    """``section.key`` -> text for every config flag given, ``--set`` included."""
    overrides: dict[str, str] = {}
    for flag, key in FLAG_KEYS.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = str(value)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"flag --set {item}: expected SECTION.KEY=VALUE")
        overrides[key.strip()] = value
    return overrides


def read_text(path: str) -> str | None:
    """A small file's text; None when it cannot be read (a cgroup file that is not there)."""
    try:
        with open(path, encoding="ascii") as file:
            return file.read(64)
    except (OSError, UnicodeDecodeError):
        return None


def load_config(
    args: argparse.Namespace,
    env: Mapping[str, str],
    read: Callable[[str], str | None] = read_text,
) -> Config:
    """The configuration, its memory budgets fitted to the container's memory limit."""
    path = config_path(args, env)
    data = load_file(path) if path else {}
    return build_config(
        data,
        file_name=path or "config",
        env=env,
        overrides=flag_overrides(args),
        memory_limit=container_limit(read),
    )


def _counted(n: int, what: str, suffix: str = "") -> list[str]:
    return [f"{n} {what}{'' if n == 1 else 's'}{suffix}"] if n else []


def check_config(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """``watchproxy check-config``: one line on stdout and 0, or one line on stderr and 2."""
    try:
        config = load_config(args, env)
        found = read_env(env)
        # What `run` reads before it serves: the kubeconfig file and its context, or the
        # in-cluster ServiceAccount files. Exec plugins are not run here.
        upstream_target(config, env).close()
    except (ConfigError, CredentialsError) as error:
        print(f"watchproxy: {error}", file=sys.stderr)
        return 2
    parts = [config_path(args, env) or "no config file"]
    parts += _counted(len(found.settings), "environment setting")
    parts += _counted(len(flag_overrides(args)), "flag setting")
    parts += _counted(len(found.ignored), "Kubernetes service-link variable", " ignored")
    print(f"watchproxy: config ok ({', '.join(parts)})")
    return 0


def install_loop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; tolerate odd platforms
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def stop_event() -> asyncio.Event:
    """An event that SIGTERM or SIGINT sets. Installed before start-up, so that a signal
    arriving while the ports open stops the process cleanly instead of killing it."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def upstream_target(config: Config, env: Mapping[str, str]) -> UpstreamTarget:
    """The apiserver and credentials the config names; CredentialsError names what is wrong."""
    return resolve_target(
        config.upstream.mode,
        kubeconfig=config.upstream.kubeconfig,
        context=config.upstream.context,
        env=env,
        reload_seconds=config.upstream.token_reload_seconds,
    )


async def run_proxy(config: Config, env: Mapping[str, str]) -> None:
    from watchproxy.app import Proxy

    stop = stop_event()
    target = upstream_target(config, env)
    # An exec plugin runs once before serving, so that a broken one stops start-up in one line.
    try:
        await target.refresh(strict=True)
    except CredentialsError:
        target.close()
        raise
    proxy = Proxy(config, target)
    try:
        await proxy.start()
    except BaseException:
        # End what did start (the upstream session, the prober) without logging about it:
        # main() reports the cause in one line.
        logging.getLogger("watchproxy").setLevel(logging.WARNING)
        await proxy.stop()
        raise
    # What the budgets were fitted to (load_config read the same file): the first thing to
    # check when a pod is OOM-killed. Logged once serving, so that a start-up that fails says
    # only why, in one line.
    limit = container_limit(read_text)
    logging.getLogger("watchproxy").info("%s", describe(limit, memory_budgets(config)))
    try:
        await stop.wait()
    finally:
        await proxy.stop()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "run")
    command = parser()
    args, unknown = command.parse_known_args(argv)
    if unknown:
        # argparse would blame the top-level parser for a subcommand's flag.
        name = f"watchproxy {args.command}" if args.command else "watchproxy"
        flag = unknown[0].partition("=")[0]
        what = "unknown flag" if flag.startswith("-") else "unexpected argument"
        print(f"{name}: {what} {flag} (see {name} --help)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.command == "inject":
        return run_inject(args)
    if args.command == "kubeconfig":
        from watchproxy.kube.kubeconfig import render_kubeconfig

        port = 8001 if args.listen_port is None else args.listen_port
        try:
            if not 1 <= port <= 65535:
                raise ValueError(f"--listen-port: must be a port number 1-65535, got {port}")
            text = render_kubeconfig(
                args.server or f"http://127.0.0.1:{port}",
                namespace=args.namespace,
                context_name=args.context_name,
                token_file=args.token_file,
            )
        except ValueError as error:
            print(f"watchproxy kubeconfig: {error}", file=sys.stderr)
            return 2
        sys.stdout.write(text)
        return 0
    if args.command == "check-config":
        return check_config(args, env)
    try:
        config = load_config(args, env)
    except ConfigError as error:
        print(f"watchproxy: {error}", file=sys.stderr)
        return 2
    setup_logging(config.logging.level, as_json=config.logging.json)
    fix_mmap_threshold()
    install_loop()
    try:
        asyncio.run(run_proxy(config, env))
    except CredentialsError as error:
        print(f"watchproxy: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"watchproxy: {error.strerror or error}", file=sys.stderr)
        return 2
    return 0
