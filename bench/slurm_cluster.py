"""A real Slurm cluster on this one machine, for tests and benchmarks: Debian's `slurmctld`,
`slurmd` and `munged` over bench.cluster's hosts mode.

One `munged` (its key made here, its socket in the cluster's folder: a path socket is reached
from every network namespace), a `slurmctld` in the root namespace listening at host 0's
gateway, and one `slurmd -N <name>` per emulated host inside that host's namespace, named as
the namespace's hosts file names it (`<cluster>-h<k>`), so no `--enable-multiple-slurmd` build
is needed. The private `slurm.conf` keeps every file under the cluster's folder; `SLURM_CONF`
in `env` points the clients (`sbatch`, `squeue`, ...) at it. Needs root.

With `rest=True` it also runs `slurmrestd` (Slurm's REST API) with JWT authentication: the
controller takes JWTs beside munge (`AuthAltTypes=auth/jwt`, a random key only root reads),
`slurmrestd` runs as `nobody` (it refuses root) on a free port of 127.0.0.1 and passes each
request's token on to the controller (`SLURM_JWT=daemon`), and `token` is one minted for root
(`scontrol token`), which `rest_url` takes.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import cluster
from bench.cluster import HostsSpec
from engine.ports import free_port

DAEMONS = ("slurmctld", "slurmd", "munged", "mungekey", "sbatch")
# the one API slurmrestd loads (jobs.backends.slurm_rest's; its dbv0.0.38 needs a slurmdbd)
REST_API = "v0.0.38"
REST_USER = "nobody"  # slurmrestd's (any user but root and SlurmUser), with its own group
# where Debian (and a source build) put Slurm's plugins, each in a folder of its own
PLUGIN_FOLDERS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                  "/usr/lib")
PARTITION = "ringside"
MAX_NODES = 2  # the partition's limit: a job asking for more is refused
MAX_TIME_MIN = 30
SLURMD_TIMEOUT_S = 5  # how soon a silent node is marked DOWN (Slurm's default: 300)


def missing() -> str:
    """Why a Slurm cluster cannot run here ("" when it can)."""
    if os.geteuid() != 0:
        return "a Slurm cluster needs root (its daemons, network namespaces)"
    absent = [name for name in DAEMONS if not shutil.which(name)]
    if absent:
        return (f"Slurm is not installed ({', '.join(absent)} missing): "
                "apt-get install -y slurmctld slurmd slurm-client munge")
    return ""


def missing_rest() -> str:
    """Why a Slurm cluster with `slurmrestd` and JWTs cannot run here ("" when it can)."""
    why = missing()
    if why:
        return why
    if not shutil.which("slurmrestd"):
        return "slurmrestd is not installed: apt-get install -y slurmrestd slurm-wlm-jwt-plugin"
    if not any(Path(p).glob("*/auth_jwt.so") for p in PLUGIN_FOLDERS):
        return ("Slurm's JWT plugin is not installed (no auth_jwt.so): "
                "apt-get install -y slurm-wlm-jwt-plugin")
    return ""


@dataclass
class SlurmCluster:
    spec: HostsSpec
    folder: Path
    cpus: int = 4  # per node: what Slurm schedules, not what the machine has
    rest: bool = False  # also run slurmrestd (JWT authentication)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    rest_url: str = ""  # slurmrestd's, once it answers
    token: str = ""  # a JWT for root, for slurmrestd

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def node(self, host: int) -> str:
        return cluster.host_ns(host)

    def start(self) -> SlurmCluster:
        self.folder.mkdir(parents=True, exist_ok=True)
        for sub in ("state", "munge"):
            (self.folder / sub).mkdir(exist_ok=True)
        os.chmod(self.folder / "munge", 0o700)
        if self.rest:  # slurmrestd (not root) reads slurm.conf here, but not the JWT key
            os.chmod(self.folder, 0o755)
            key = self.folder / "jwt.key"
            key.write_bytes(os.urandom(32))
            os.chmod(key, 0o600)
        self._munge()
        for host in range(self.spec.hosts):
            (self.folder / f"spool-{self.node(host)}").mkdir(exist_ok=True)
        self.conf.write_text(self._conf())
        if self.rest:
            os.chmod(self.conf, 0o644)
        # slurmd loads a cgroup plugin whatever the task and proctrack plugins; this machine
        # mounts the v1 hierarchy (autodetection expects a cgroup filesystem at the top)
        (self.folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n")
        self.procs["slurmctld"] = self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)],
                                              "slurmctld")
        for host in range(self.spec.hosts):
            self.start_node(host)
        self.wait_idle(range(self.spec.hosts))
        if self.rest:
            self._slurmrestd()
        return self

    def start_node(self, host: int) -> None:
        name = self.node(host)
        self.procs[name] = self._spawn(cluster.host_command(
            host, ["slurmd", "-D", "-N", name, "-f", str(self.conf)]), name)

    def kill_node(self, host: int) -> None:
        """The node dies: its `slurmd` and everything else in its namespace (the job steps'
        `slurmstepd`s and the ranks they started) are killed at once."""
        proc = self.procs.pop(self.node(host))
        proc.kill()
        proc.wait()
        pids = subprocess.run(["ip", "netns", "pids", self.node(host)], capture_output=True,
                              text=True, check=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:  # it ended meanwhile
                pass

    def wait_idle(self, hosts: range, timeout: float = 30.0) -> None:
        names = {self.node(h) for h in hosts}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.client("sinfo", "-h", "-N", "-o", "%N %t")
            idle = {line.split()[0] for line in out.splitlines() if line.split()[1] == "idle"}
            if names <= idle:
                return
            time.sleep(0.3)
        raise RuntimeError(f"Slurm nodes not idle after {timeout}s: {out}\n"
                           f"{self.log_tail('slurmctld')}")

    def client(self, *args: str) -> str:
        return subprocess.run(list(args), env={**os.environ, **self.env}, capture_output=True,
                              text=True, check=True, timeout=30).stdout

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _munge(self) -> None:
        key = self.folder / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", "--force", "--keyfile", str(key)], check=True,
                       capture_output=True)
        os.chmod(key, 0o600)
        munge = self.folder / "munge"
        self.procs["munged"] = self._spawn(
            ["munged", "--foreground", "--force", "--key-file", str(key),
             "--socket", str(munge / "socket"), "--pid-file", str(munge / "munged.pid"),
             "--log-file", str(munge / "munged.log"), "--seed-file", str(munge / "seed")],
            "munged")
        deadline = time.monotonic() + 10
        while not (munge / "socket").exists():
            if time.monotonic() > deadline or self.procs["munged"].poll() is not None:
                raise RuntimeError("munged did not start: "
                                   f"{(munge / 'munged.log').read_text(errors='replace')}")
            time.sleep(0.05)

    def _slurmrestd(self, timeout: float = 30.0) -> None:
        """Start slurmrestd, mint root's token and wait until slurmrestd listens."""
        port = free_port()
        self.procs["slurmrestd"] = self._spawn(
            ["slurmrestd", "-a", "rest_auth/jwt", "-s", f"openapi/{REST_API}",
             "-u", REST_USER, "-g", str(pwd.getpwnam(REST_USER).pw_gid), "-f", str(self.conf),
             f"127.0.0.1:{port}"], "slurmrestd",
            {"SLURM_JWT": "daemon"})
        minted = self.client("scontrol", "token", "username=root", "lifespan=3600")
        self.token = minted.strip().partition("SLURM_JWT=")[2]
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs["slurmrestd"].poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    self.rest_url = url
                    return
            except OSError:
                time.sleep(0.1)
        said = (self.folder / "slurmrestd.out").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"slurmrestd does not answer at {url}: {said}")

    def _conf(self) -> str:
        d, gateway = self.folder, self.spec.gateway(0)
        nodes = "".join(
            f"NodeName={self.node(h)} NodeAddr={self.spec.address(h)} CPUs={self.cpus} "
            "State=UNKNOWN\n" for h in range(self.spec.hosts))
        jwt = (f"AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key={d}/jwt.key\n"
               if self.rest else "")
        partition = (f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxNodes={MAX_NODES} "
                     f"MaxTime={MAX_TIME_MIN} State=UP")
        return f"""ClusterName=ringside
SlurmctldHost={socket.gethostname().split('.')[0]}({gateway})
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/socket
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT_S}
InactiveLimit=0
KillWait=5
MinJobAge=600
SchedulerParameters=sched_interval=1
{jwt}{nodes}{partition}
"""

    def _spawn(self, cmd: list[str], name: str, env: dict[str, str] | None = None
               ) -> subprocess.Popen:
        log = (self.folder / f"{name}.out").open("ab")
        return subprocess.Popen(cmd, env={**os.environ, **self.env, **(env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
