"""A real single-node SLURM cluster for the tests, started without systemd from Debian's packages
(`apt-get install slurm-wlm munge`, as root): munged with a generated key on its own socket, then slurmctld and
slurmd in the foreground with a minimal slurm.conf, every file and port private to one temporary directory.

Clients find the cluster through SLURM_CONF, except inside a job: snakemake-executor-plugin-slurm-jobstep (0.6.1)
drops every SLURM_* variable before its nested `srun`, which then looks for /etc/slurm/slurm.conf and then
/run/slurm/conf/slurm.conf (where a configless slurmd keeps its copy). So while it runs, /run/slurm/conf links to
the cluster's directory, and a machine with its own /etc/slurm/slurm.conf or /run/slurm/conf is left alone.

Nothing here fakes SLURM: `missing()` names what prevents a real cluster (the tests skip with it), and `start()`
raises SlurmUnavailable with the daemons' own logs when one does not come up."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "sacct", "squeue", "sinfo", "scontrol")
INSTALL = "apt-get install slurm-wlm munge (root)"
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
RUN_CONF = Path("/run/slurm/conf")  # a directory (configless slurmd: a link to its cache) holding slurm.conf


class SlurmUnavailable(RuntimeError):
    """A cluster could not be started here (the message says why, with the daemons' logs)."""


def _which(name: str) -> str | None:
    # the daemons live in /usr/sbin, which a non-login PATH may lack
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def missing() -> str | None:
    """Why a cluster cannot be started on this machine, or None."""
    absent = [name for name in (*DAEMONS, *CLIENTS) if _which(name) is None]
    if absent:
        return f"slurm-wlm is not installed ({', '.join(absent)} missing): {INSTALL}"
    if os.geteuid() != 0:
        return "a private SLURM cluster needs root (slurmd starts every job as its submitting user)"
    for path in (SYSTEM_CONF, RUN_CONF):
        if path.exists() or path.is_symlink():
            return f"{path} exists (this machine's own SLURM): srun inside a test job would read it instead"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise SlurmUnavailable("no MemTotal in /proc/meminfo")


@dataclass
class SlurmCluster:
    """One node called `localhost` with all of this machine's CPUs and most of its memory, partition `test`."""

    root: Path
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    memory_mb: int = field(default_factory=lambda: int(_memory_mb() * 0.9))
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    made_run_dir: bool = False  # /run/slurm did not exist: stop() removes it again

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, sacct, snakemake --executor slurm) needs to reach this cluster."""
        path = os.environ.get("PATH", "")
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": f"{path}{os.pathsep}/usr/sbin"}

    def log(self, name: str) -> Path:
        return self.root / "log" / f"{name}.log"

    def logs(self) -> str:
        texts = []
        for name in DAEMONS:
            path = self.log(name)
            tail = path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"
            texts.append(f"--- {name} ({path}) ---\n{tail}")
        return "\n".join(texts)

    def write_files(self) -> None:
        for sub in ("log", "munge", "ctld", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # munged insists on private directories and a key only its owner can read
        for sub in ("ctld", "spool"):
            os.chmod(self.root / sub, 0o700)
        os.chmod(self.root / "munge", 0o711)  # every user's clients reach the socket, only root the key
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, slurmd_port = _free_ports(2)
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=hf2triton-test",
                    "SlurmctldHost=localhost",
                    f"SlurmctldPort={ctld_port}",
                    f"SlurmdPort={slurmd_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.root / 'munge' / 'munge.socket'}",
                    f"StateSaveLocation={self.root / 'ctld'}",
                    f"SlurmdSpoolDir={self.root / 'spool'}",
                    f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={self.root / 'slurmd.pid'}",
                    f"SlurmctldLogFile={self.log('slurmctld')}",
                    f"SlurmdLogFile={self.log('slurmd')}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core_Memory",
                    "SchedulerType=sched/backfill",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    # no slurmdbd: sacct asks slurmctld, which keeps finished jobs for MinJobAge seconds
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/none",
                    "MinJobAge=3600",
                    "SlurmctldTimeout=30",
                    "SlurmdTimeout=30",
                    "InactiveLimit=0",
                    "KillWait=5",
                    f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN",
                    "PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def _spawn(self, name: str, *args: str) -> None:
        binary = _which(name)
        if binary is None:
            raise SlurmUnavailable(f"{name} not found: {INSTALL}")
        output = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - the process owns it
        self.processes[name] = subprocess.Popen(  # noqa: S603
            [binary, *args], stdout=output, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def _wait(self, what: str, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise SlurmUnavailable(f"{name} exited ({process.returncode}) before {what}:\n{self.logs()}")
            if check():
                return
            time.sleep(0.5)
        raise SlurmUnavailable(f"no {what} within {timeout:.0f} s:\n{self.logs()}")

    def run(self, *command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=timeout, check=False)  # noqa: S603

    def node_state(self) -> str:
        result = self.run("sinfo", "-h", "-N", "-o", "%T")
        return result.stdout.strip() if result.returncode == 0 else ""

    def start(self, timeout: float = 60) -> SlurmCluster:
        reason = missing()
        if reason:
            raise SlurmUnavailable(reason)
        self.write_files()
        munge = self.root / "munge"
        self._spawn(
            "munged",
            "--foreground",
            "--force",
            f"--socket={munge / 'munge.socket'}",
            f"--key-file={munge / 'munge.key'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--seed-file={munge / 'munged.seed'}",
            f"--log-file={self.log('munged')}",
        )
        self._wait("munged's socket", (munge / "munge.socket").exists, timeout)
        self.made_run_dir = not RUN_CONF.parent.exists()
        RUN_CONF.parent.mkdir(parents=True, exist_ok=True)
        RUN_CONF.symlink_to(self.root, target_is_directory=True)
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._wait("slurmctld answering", lambda: self.run("scontrol", "ping").returncode == 0, timeout)
        self._spawn("slurmd", "-D", "-N", "localhost", "-f", str(self.conf))
        self._wait("an idle node", lambda: self.node_state() == "idle", timeout)
        return self

    def stop(self) -> None:
        # slurmd first (it ends its job steps), then the controller, then munge
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()
        if RUN_CONF.is_symlink() and Path(os.readlink(RUN_CONF)) == self.root:
            RUN_CONF.unlink()
            if self.made_run_dir and not any(RUN_CONF.parent.iterdir()):
                RUN_CONF.parent.rmdir()

    def jobs(self) -> list[dict[str, str]]:
        """Every job of the last MinJobAge seconds (id, name, state, comment), finished ones included. From squeue:
        without slurmdbd, sacct only answers "Slurm accounting storage is disabled"."""
        result = self.run("squeue", "--states=all", "--noheader", "--format=%i|%j|%T|%k")
        if result.returncode != 0:
            raise AssertionError(f"squeue failed ({result.returncode}): {result.stderr}")
        fields = ("id", "name", "state", "comment")
        return [dict(zip(fields, line.split("|"), strict=False)) for line in result.stdout.splitlines() if line]
