"""A real single-node Kubernetes 1.37 for the tests, inside a network namespace of its own.

The rig (:class:`Node`) runs, all as root on this machine:

- kubetestenv (tests/realapi: kube-apiserver + etcd) as the control plane, on port 443 of the
  namespace, with credentials written beforehand (:mod:`tests.realnode.pki`): a static token
  for ``system:node:<name>``, a client certificate for the apiserver's calls to the kubelet;
- containerd (Debian's, CRI plugin, runc, ``restrict_oom_score_adj``), the kubelet,
  kube-controller-manager, kube-scheduler and kube-proxy (``kubenode``, built by
  tests/realnode/build.sh in kubetestenv's module);
- a TCP relay (:mod:`tests.realnode.forward`) from a port on the machine's loopback to the
  apiserver inside the namespace: the tests, kubectl and watchproxy reach the cluster there.

Where everything with an address lives (docs/cluster.md, "The real-node tier"): one network
namespace, ``wprn<pid>``, holds a bridge with the node IP (10.88.0.1/24, the pods' gateway),
the pods' veths (the CNI bridge plugin, run by containerd inside the namespace), every daemon's
sockets and kube-proxy's iptables rules (iptables mode; Debian's ``iptables``, its nf_tables
backend). ClusterIPs are on no interface: a pod's connection to one, the ``kubernetes``
Service's 10.0.0.1 included, is DNATed by kube-proxy's rules to an endpoint, as in a cluster
(the Service range is routed to the bridge, so what is not DNATed meets kube-proxy's filter
rules, as on a node with a default route).
The apiserver listens on port 443 of the namespace and advertises the node IP, whose lease
endpoint reconciler publishes it as the ``kubernetes`` Service's endpoint; the kubelet and the
controllers reach it on the namespace's loopback. The machine's own interfaces get nothing.

The daemons also share one private mount namespace (a holder process, ``unshare --mount
--propagation private``): containerd's overlay mounts, the pods' volumes and network-namespace
files never show in the machine's mount table, and every one of them is gone when the last
process of that namespace ends, also after a crash. tmpfs covers the fixed paths that
containerd 1.6, the CNI plugins and the kubelet use whatever their configuration says
(``/run/containerd``, ``/var/lib/cni``, ``/run/netns``, ``/var/log/containers``).

:meth:`Node.close` (idempotent; also run at exit and on SIGTERM) stops the daemons by their PIDs,
kills what is left in the node's cgroups and the containerd shims of this containerd, removes
the cgroups, deletes the namespace and the run directory's container store.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.realapi import fixture as realapi
from tests.realnode import pki

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
NODE_NAME = "realnode"
BRIDGE = "wprn0"
NODE_IP = "10.88.0.1"
POD_SUBNET = "10.88.0.0/24"
SERVICE_CIDR = "10.0.0.0/24"
"""kubetestenv's ``--service-cluster-ip-range``."""
SERVICE_IP = "10.0.0.1"
"""The ``kubernetes`` Service's ClusterIP: the first of kubetestenv's 10.0.0.0/24."""
APISERVER_PORT = 443
KUBE_PROXY_METRICS_PORT = 10249
NETNS_PREFIX = "wprn"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Paths that containerd 1.6, libcni and the kubelet use whatever their configuration says;
# covered by tmpfs in the node's mount namespace.
FIXED_PATHS = ("/run/containerd", "/var/lib/cni", "/run/netns", "/var/log/containers")
STOP_TIMEOUT = 20.0
START_TIMEOUT = 120.0
REQUIRED_COMMANDS = (
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "ip",
    "iptables",
    "iptables-restore",
    "nsenter",
    "unshare",
)
CNI_BIN = Path("/usr/lib/cni")


def kubenode_binary() -> Path:
    return HERE / "bin" / f"kubenode-{realapi.VERSION}"


def kubenode_problem() -> str | None:
    """Why the kubenode binary cannot be used, or None."""
    binary = kubenode_binary()
    build = "run bash tests/realnode/build.sh"
    if not binary.exists():
        return f"{binary} is missing: {build} (needs Go)"
    sources = (
        realapi.HERE / "go.mod",
        realapi.HERE / "go.sum",
        realapi.HERE / "kubenode" / "main.go",
    )
    stale = [p.name for p in sources if p.stat().st_mtime > binary.stat().st_mtime]
    if stale:
        return f"{binary} is older than {', '.join(stale)}: {build}"
    return None


def environment_problem() -> str | None:
    """Why this machine cannot run the node (not root, a package missing), or None."""
    if os.geteuid() != 0:
        return "the real-node tier needs root (network namespaces, mounts, containerd)"
    missing = [c for c in REQUIRED_COMMANDS if shutil.which(c) is None]
    missing += [
        f"{CNI_BIN}/{p}" for p in ("bridge", "host-local", "loopback") if not (CNI_BIN / p).exists()
    ]
    if missing:
        return (
            f"missing {', '.join(missing)} (apt-get install containerd runc "
            "containernetworking-plugins iptables; scripts/test.sh installs them as root)"
        )
    if not (CGROUP_ROOT / "memory").is_dir():
        return "the kubelet here runs on cgroup v1 controllers under /sys/fs/cgroup (none found)"
    return kubenode_problem() or realapi.binary_problem()


def run(command: list[str], *, timeout: float = 30.0, check: bool = True) -> str:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, what: str, step: float = 0.05
) -> None:
    """A bounded poll, for what cannot be awaited (a file that a child process writes)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(step)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_kubeconfig(path: Path, server: str, ca_file: str, token: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "realnode",
        "clusters": [
            {"name": "realnode", "cluster": {"server": server, "certificate-authority": ca_file}}
        ],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [{"name": "realnode", "context": {"cluster": "realnode", "user": "user"}}],
    }
    path.write_text(json.dumps(config), encoding="utf-8")


def list_netns() -> list[str]:
    return [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()]


def cgroup_dirs(name: str) -> list[Path]:
    """The node's cgroup directory in every mounted hierarchy (v1 controllers and the named
    and unified ones)."""
    return [d / name for d in sorted(CGROUP_ROOT.iterdir()) if d.is_dir() and not d.is_symlink()]


def remove_cgroup_tree(top: Path) -> list[str]:
    """rmdir ``top`` and everything under it, deepest first; returns what could not go."""
    if not top.exists():
        return []
    left = []
    for path in sorted(cgroup_subdirs(top), key=lambda p: -len(p.parts)):
        try:
            path.rmdir()
        except OSError as error:
            left.append(f"{path}: {error}")
    try:
        top.rmdir()
    except OSError as error:
        left.append(f"{top}: {error}")
    return left


def cgroup_subdirs(top: Path) -> list[Path]:
    """Every cgroup under ``top``. With os.walk, not Path.rglob: the runtime removes a
    container's cgroup as its last process dies, and rglob raised FileNotFoundError when a
    directory it had listed was gone before it looked inside (a teardown killing the pods
    failed so); os.walk passes over a directory it can no longer read."""
    return [Path(root) / d for root, dirs, _files in os.walk(top) for d in dirs]


def cgroup_pids(top: Path) -> list[int]:
    pids: list[int] = []
    for cgroup in [top, *cgroup_subdirs(top)]:
        with contextlib.suppress(OSError):  # gone since it was listed
            pids += [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    return pids


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (the shims name their containerd's socket)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(entry.name))
    return found


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout)
        finally:
            self.log.close()


@dataclass
class Node:
    """One running node and its control plane; see the module's docstring."""

    run_dir: Path
    name: str = field(default_factory=lambda: f"{NETNS_PREFIX}{os.getpid()}")
    daemons: dict[str, Daemon] = field(default_factory=dict)
    created_dirs: list[Path] = field(default_factory=list)
    credentials: pki.Credentials | None = None
    holder: subprocess.Popen[bytes] | None = None
    port: int = 0
    """The relay's port on the machine's loopback: the apiserver as the tests reach it."""
    closed: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    # Paths ---------------------------------------------------------------------------------

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.name}"

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd" / "containerd.sock"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> str:
        assert self.credentials is not None
        return str(self.credentials.ca_file)

    @property
    def token(self) -> str:
        assert self.credentials is not None
        return self.credentials.admin_token

    @property
    def admin_kubeconfig(self) -> str:
        return str(self.run_dir / "admin.kubeconfig")

    @property
    def pod_logs_dir(self) -> Path:
        return self.run_dir / "pod-logs"

    def inside(self) -> list[str]:
        """The command prefix that runs a program in the node's network and mount namespaces."""
        assert self.holder is not None
        return [
            "nsenter",
            f"--mount=/proc/{self.holder.pid}/ns/mnt",
            f"--net={self.netns_path}",
            "--",
        ]

    # Start ---------------------------------------------------------------------------------

    def start(self, images: list[Path]) -> None:
        started = time.monotonic()
        cleanup_orphans()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._network()
        self._mount_namespace()
        self._control_plane()
        self._timed("control plane", started)
        self._containerd()
        for archive in images:
            run(
                [
                    "ctr",
                    "--address",
                    str(self.containerd_socket),
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    "--no-unpack",
                    str(archive),
                ],
                timeout=180,
            )
        self._timed("containerd + images", started)
        self._node_daemons()
        self._timed("node daemons started", started)

    def _timed(self, what: str, started: float) -> None:
        self.timings[what] = round(time.monotonic() - started, 1)

    def _network(self) -> None:
        run(["ip", "netns", "add", self.name])
        ns = ["ip", "-n", self.name]
        run([*ns, "link", "set", "lo", "up"])
        run([*ns, "link", "add", BRIDGE, "type", "bridge"])
        run([*ns, "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE])
        run([*ns, "link", "set", BRIDGE, "up"])
        # A node's default route would take a ClusterIP packet that kube-proxy did not DNAT
        # (a Service with no endpoints, or none local) on to its FORWARD chain, where
        # kube-proxy's filter rules reject or drop it; this namespace has no default route, so
        # the Service range gets one to the bridge, where no address answers for it.
        run([*ns, "route", "add", SERVICE_CIDR, "dev", BRIDGE])

    def _mount_namespace(self) -> None:
        for path in map(Path, FIXED_PATHS):
            if not path.exists():
                path.mkdir(parents=True)
                self.created_dirs.append(path)
        mounts = " && ".join(f"mount -t tmpfs -o mode=0755 wprn {p}" for p in FIXED_PATHS)
        ready = self.run_dir / "holder.ready"
        # The holder keeps the mount namespace alive between the daemons' starts; `exec sleep`
        # makes its PID the one the daemons enter and the one close() ends.
        self.holder = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                f"{mounts} && touch {ready} && exec sleep infinity",
            ],
            stdin=subprocess.DEVNULL,
        )
        wait_until(
            lambda: ready.exists() or self.holder.poll() is not None,
            timeout=10,
            what="the mount namespace",
        )
        if self.holder.poll() is not None:
            raise RuntimeError(f"the mount-namespace holder exited {self.holder.returncode}")

    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> Daemon:
        log_path = self.run_dir / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the Daemon, closed in stop()
        process = subprocess.Popen(
            [*self.inside(), *command],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        daemon = Daemon(name, process, log_path, log)
        self.daemons[name] = daemon
        return daemon

    def _await_file(self, daemon: Daemon, path: Path, timeout: float = START_TIMEOUT) -> None:
        try:
            wait_until(
                lambda: path.exists() or daemon.process.poll() is not None,
                timeout=timeout,
                what=f"{daemon.name} ({path.name})",
            )
        except TimeoutError as error:
            raise RuntimeError(f"{error}; log tail:\n{daemon.tail()}") from None
        if daemon.process.poll() is not None:
            raise RuntimeError(
                f"{daemon.name} exited {daemon.process.returncode}:\n{daemon.tail()}"
            )

    def _control_plane(self) -> None:
        state = self.run_dir / "kubetestenv"
        self.credentials = pki.write_credentials(
            state / "pki", node_name=NODE_NAME, ip_addresses=(NODE_IP, SERVICE_IP)
        )
        creds = self.credentials
        ready = self.run_dir / "kubetestenv.ready"
        apiserver_args = [
            realapi.APISERVER_ARGS,
            # These replace kubetestenv's own flags of the same names: it serves loopback only,
            # and turns the ServiceAccount admission plugin off (no controller manager makes
            # the "default" ServiceAccounts it wants there; here one does).
            "--bind-address=0.0.0.0",
            f"--advertise-address={NODE_IP}",
            "--disable-admission-plugins=",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={creds.kubelet_client_cert}",
            f"--kubelet-client-key={creds.kubelet_client_key}",
            "--kubelet-preferred-address-types=InternalIP",
            # kubetestenv has none (it advertises loopback, which no endpoint may be): here the
            # lease reconciler publishes the node IP as the `kubernetes` Service's endpoint,
            # which kube-proxy's rules send the Service IP to.
            "--endpoint-reconciler-type=lease",
            # The apiserver's record of who listed and watched configmaps, as whom (the
            # ServiceAccount token's pod in the user's extra): what a proxy in front of it
            # really sent upstream.
            f"--audit-policy-file={self._audit_policy()}",
            f"--audit-log-path={self.audit_log}",
        ]
        apiserver = self._spawn(
            "kubetestenv",
            [
                str(realapi.binary_path()),
                "-dir",
                str(state),
                "-ready-file",
                str(ready),
                "-port",
                str(APISERVER_PORT),
                "-compaction-interval",
                realapi.COMPACTION_INTERVAL,
                "-apiserver-args",
                " ".join(apiserver_args),
            ],
        )
        port_file = self.run_dir / "forward.port"
        log_path = self.run_dir / "forward.log"
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the Daemon
        relay = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.realnode.forward",
                self.netns_path,
                "127.0.0.1",
                str(APISERVER_PORT),
                str(port_file),
            ],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.daemons["forward"] = Daemon("forward", relay, log_path, log)
        self._await_file(self.daemons["forward"], port_file, timeout=30)
        self.port = int(port_file.read_text())
        self._await_file(apiserver, ready)
        write_kubeconfig(Path(self.admin_kubeconfig), self.url, self.ca_file, creds.admin_token)

    @property
    def audit_log(self) -> Path:
        return self.run_dir / "audit.log"

    def _audit_policy(self) -> Path:
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {
                    "level": "Metadata",
                    "verbs": ["list", "watch"],
                    "resources": [{"group": "", "resources": ["configmaps"]}],
                },
                {"level": "None"},
            ],
        }
        path = self.run_dir / "audit-policy.yaml"
        path.write_text(json.dumps(policy), encoding="utf-8")
        return path

    def audit_events(self, namespace: str) -> list[dict[str, Any]]:
        """The apiserver's audit events (JSON lines, written before it answers) of configmap
        lists and watches in ``namespace``, oldest first."""
        events = []
        with open(self.audit_log, encoding="utf-8") as log:
            for line in log:
                event = json.loads(line)
                if event.get("objectRef", {}).get("namespace") == namespace:
                    events.append(event)
        return events

    def _inside_kubeconfig(self, name: str, token: str) -> Path:
        """A kubeconfig for the daemons inside the namespace: the apiserver on its loopback."""
        assert self.credentials is not None
        path = self.run_dir / f"inside-{name}.kubeconfig"
        server = f"https://127.0.0.1:{APISERVER_PORT}"
        write_kubeconfig(path, server, self.ca_file, token)
        return path

    def _containerd(self) -> None:
        root = self.run_dir / "containerd"
        cni_conf = self.run_dir / "cni"
        cni_conf.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "wprn",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.run_dir / "cni-ipam"),
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                }
            ],
        }
        (cni_conf / "10-wprn.conflist").write_text(json.dumps(conflist), encoding="utf-8")
        config = f"""version = 2
root = "{root}/root"
state = "{root}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{root}/containerd.sock.ttrpc"
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Root here has no CAP_SYS_RESOURCE: runc cannot lower a sandbox's oom_score_adj to the
  # kubelet's -998, and fails every sandbox unless the value is kept at containerd's own.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
"""
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.toml").write_text(config, encoding="utf-8")
        daemon = self._spawn("containerd", ["containerd", "--config", str(root / "config.toml")])
        self._await_file(daemon, self.containerd_socket, timeout=60)
        # The socket exists a moment before the CRI plugin answers; ctr's version call waits.
        run(["ctr", "--address", str(self.containerd_socket), "version"], timeout=30)

    def _node_daemons(self) -> None:
        assert self.credentials is not None
        creds = self.credentials
        admin = self._inside_kubeconfig("admin", creds.admin_token)
        kubelet_config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # The machine has cgroup v1 and no systemd.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.name}",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "podLogsDir": str(self.pod_logs_dir),
            "readOnlyPort": 0,
            "port": 10250,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": self.ca_file},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # A shared development disk may be fuller than the kubelet's defaults like.
            "evictionHard": {
                "memory.available": "0%",
                "nodefs.available": "0%",
                "nodefs.inodesFree": "0%",
                "imagefs.available": "0%",
            },
            "serializeImagePulls": False,
            "resolvConf": "",
            "nodeStatusUpdateFrequency": "4s",
            "syncFrequency": "10s",
        }
        config_path = self.run_dir / "kubelet.yaml"
        config_path.write_text(json.dumps(kubelet_config), encoding="utf-8")
        # The kubelet wants its cgroup root to exist in every hierarchy; cpuset's needs its CPUs
        # and memory nodes before anything can join it.
        for directory in cgroup_dirs(self.name):
            directory.mkdir(exist_ok=True)
            if directory.parent.name == "cpuset":
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (directory / knob).write_text((directory.parent / knob).read_text())
        kubenode = str(kubenode_binary())
        self._spawn(
            "kubelet",
            [
                kubenode,
                "kubelet",
                f"--config={config_path}",
                f"--kubeconfig={self._inside_kubeconfig('kubelet', creds.node_token)}",
                f"--root-dir={self.run_dir / 'kubelet'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-controller-manager",
            [
                kubenode,
                "kube-controller-manager",
                f"--kubeconfig={admin}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--root-ca-file={self.ca_file}",
                f"--service-account-private-key-file={creds.sa_key}",
                "--use-service-account-credentials=false",
                # No node CIDRs are allocated (--allocate-node-cidrs is off): the CNI plugin's
                # host-local IPAM owns the pod subnet.
                "--concurrent-gc-syncs=5",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                kubenode,
                "kube-scheduler",
                f"--kubeconfig={admin}",
                "--leader-elect=false",
                "--secure-port=0",
            ],
        )
        self._spawn("kube-proxy", [kubenode, "kube-proxy", f"--config={self._kube_proxy_config()}"])

    def _kube_proxy_config(self) -> Path:
        assert self.credentials is not None
        kubeconfig = self._inside_kubeconfig("kube-proxy", self.credentials.proxy_token)
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": NODE_NAME,
            "mode": "iptables",
            # Traffic from the pods' subnet is the cluster's own: not masqueraded, so a proxy
            # pod sees its tenants' pod IPs.
            "clusterCIDR": POD_SUBNET,
            "detectLocalMode": "ClusterCIDR",
            # The namespace's loopback: nothing outside the node reaches these.
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": f"127.0.0.1:{KUBE_PROXY_METRICS_PORT}",
            # NodePorts on the node IP only, and none on loopback (which would need
            # route_localnet, a sysctl kube-proxy would change).
            "nodePortAddresses": ["primary"],
            "iptables": {"localhostNodePorts": False},
            # The conntrack table's size is the machine's (one table for every namespace):
            # leave it and its timeouts as they are.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            # Root here has no CAP_SYS_RESOURCE: kube-proxy's -999 could not be set.
            "oomScoreAdj": 0,
        }
        path = self.run_dir / "kube-proxy.yaml"
        path.write_text(json.dumps(config), encoding="utf-8")
        return path

    def iptables_rules(self, table: str = "nat") -> str:
        """kube-proxy's rules in the node's namespace (``iptables-save``)."""
        return run([*self.inside(), "iptables-save", "-t", table])

    def wait_service_routing(
        self, service_port: str = "default/kubernetes:https", *, timeout: float = 30
    ) -> None:
        """Until kube-proxy's rules send a Service's ClusterIP (``namespace/name:port``) to an
        endpoint. For the ``kubernetes`` Service, which pods reach the apiserver by
        (KUBERNETES_SERVICE_HOST): its first sync, once the Node exists. A Service whose
        endpoints just became ready lags behind them by the EndpointSlice controller and
        kube-proxy's next sync (at least a second apart)."""
        try:
            wait_until(
                lambda: f'"{service_port} cluster IP"' in self.iptables_rules(),
                timeout=timeout,
                what=f"kube-proxy's rules for {service_port}",
                step=0.2,
            )
        except TimeoutError as error:
            raise RuntimeError(f"{error}; log tail:\n{self.daemons['kube-proxy'].tail()}") from None

    def check_alive(self) -> None:
        """Raise, with its log's tail, if a daemon has exited."""
        for daemon in self.daemons.values():
            if daemon.process.poll() is not None:
                raise RuntimeError(
                    f"{daemon.name} exited {daemon.process.returncode}:\n{daemon.tail()}"
                )

    # Stop ----------------------------------------------------------------------------------

    def close(self) -> list[str]:
        """Stop and remove everything; idempotent. Returns what could not be removed."""
        if self.closed:
            return []
        problems: list[str] = []
        started = time.monotonic()
        self._stop("kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy")
        self.timings["teardown: node daemons stopped"] = round(time.monotonic() - started, 1)
        # The pods' processes: everything in the node's cgroups.
        pids_root = CGROUP_ROOT / "pids" / self.name
        with contextlib.suppress(TimeoutError):
            for _ in range(50):
                pids = cgroup_pids(pids_root)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                wait_until(lambda: not cgroup_pids(pids_root), timeout=2, what="pods' processes")
        # The shims this containerd started (daemonized: not our children).
        shims = [
            p
            for p in processes_mentioning(str(self.containerd_socket))
            if p not in self._own_pids()
        ]
        for pid in shims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not any(pid_alive(p) for p in shims), timeout=10, what="the shims")
        self.timings["teardown: pods and shims killed"] = round(time.monotonic() - started, 1)
        self._stop("containerd", "kubetestenv", "forward")
        self.timings["teardown: control plane stopped"] = round(time.monotonic() - started, 1)
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(STOP_TIMEOUT)
        for directory in cgroup_dirs(self.name):
            problems += remove_cgroup_tree(directory)
        self.timings["teardown: cgroups removed"] = round(time.monotonic() - started, 1)
        if self.name in list_netns():
            run(["ip", "netns", "delete", self.name], check=False)
        # The mount points this node created, unless another node runs (a second test
        # process): removing a directory unmounts it in every namespace that mounted it.
        if not any(ns.startswith(NETNS_PREFIX) for ns in list_netns()):
            for path in reversed(self.created_dirs):
                with contextlib.suppress(OSError):
                    path.rmdir()
        # The container store: hundreds of MB of unpacked layers per run.
        shutil.rmtree(self.run_dir / "containerd", ignore_errors=True)
        shutil.rmtree(self.run_dir / "kubelet", ignore_errors=True)
        self.timings["teardown: all removed"] = round(time.monotonic() - started, 1)
        # Set last: a teardown cut short (a second signal) runs again, from atexit.
        self.closed = True
        problems += leftovers(self.name, self.run_dir)
        return problems

    def _stop(self, *names: str) -> None:
        """SIGTERM to all of ``names`` at once, then each is awaited (SIGKILL if it hangs)."""
        daemons = [self.daemons[n] for n in names if n in self.daemons]
        for daemon in daemons:
            if daemon.process.poll() is None:
                daemon.process.send_signal(signal.SIGTERM)
        for daemon in daemons:
            daemon.stop()

    def _own_pids(self) -> set[int]:
        return {d.process.pid for d in self.daemons.values()}


# The app image doubles as the sandbox image (tests/realnode/images.py).
PAUSE_IMAGE = "docker.io/library/wprn-app:1"


def leftovers(name: str, run_dir: Path) -> list[str]:
    """What a node named ``name`` left on the machine: its namespace, cgroups, mounts,
    processes. Empty when the machine is as it was."""
    found = []
    if name in list_netns():
        found.append(f"network namespace {name}")
    found += [f"cgroup {d}" for d in cgroup_dirs(name) if d.exists()]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [
        f"mount {line}" for line in mounts.splitlines() if str(run_dir) in line or name in line
    ]
    found += [f"process {pid}" for pid in processes_mentioning(str(run_dir))]
    return found


def _net_inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def kill_stray_daemons() -> list[int]:
    """End the daemons of nodes whose teardown did not finish (found by their command lines,
    which name a pytest ``realnode`` run directory, and by their network namespace, which is
    no longer one of the live nodes'). Returns their PIDs."""
    live = {_net_inode(f"/run/netns/{ns}") for ns in list_netns() if ns.startswith(NETNS_PREFIX)}
    own = _net_inode("/proc/self/ns/net")
    found = []
    for pid in processes_mentioning("/realnode"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"pytest-of-" not in cmdline or b"tests.realnode.forward" in cmdline:
            continue
        inode = _net_inode(f"/proc/{pid}/ns/net")
        if inode is None or inode in live or inode == own:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        found.append(pid)
    return found


def cleanup_orphans() -> None:
    """Remove the namespaces, cgroups and daemons of nodes whose test process died without its
    teardown (SIGKILL, a power cut, a teardown cut short), so that a new run starts from a
    clean machine."""
    kill_stray_daemons()
    for ns in list_netns():
        if ns.startswith(NETNS_PREFIX) and ns[len(NETNS_PREFIX) :].isdigit():
            pid = int(ns[len(NETNS_PREFIX) :])
            if pid == os.getpid() or pid_alive(pid):
                continue
            for procs in processes_mentioning(f"/run/netns/{ns}"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(procs, signal.SIGKILL)
            for directory in cgroup_dirs(ns):
                for victim in cgroup_pids(directory):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victim, signal.SIGKILL)
            run(["ip", "netns", "delete", ns], check=False)
            for directory in cgroup_dirs(ns):
                with contextlib.suppress(TimeoutError):
                    wait_until(lambda d=directory: not cgroup_pids(d), timeout=5, what="orphans")  # type: ignore[misc]
                remove_cgroup_tree(directory)


_live: list[Node] = []


def _close_live() -> None:
    while _live:
        _live.pop().close()
    kill_stray_daemons()


def _on_sigterm(signum: int, frame: Any) -> None:
    # pytest unwinds on KeyboardInterrupt and runs the fixtures' finalizers; atexit is the
    # backstop for whatever still runs after that.
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def running_node(run_dir: Path, images: list[Path]) -> Iterator[Node]:
    """Start a node; stop it on the way out, an exception, SIGTERM or interpreter exit."""
    node = Node(run_dir)
    _live.append(node)
    if len(_live) == 1:
        atexit.register(_close_live)
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        node.start(images)
        yield node
    finally:
        node.close()
        if node in _live:
            _live.remove(node)
