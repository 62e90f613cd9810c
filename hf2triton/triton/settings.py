"""One tritonserver of ours as configured: its settings (server spec, repository, work directory, models), the
addresses it listens on and clients connect to, and its command line (the API keys kept off it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf2triton import host
from hf2triton.locks import exclusive
from hf2triton.specs import ServerSpec, from_param
from hf2triton.triton import client
from hf2triton.triton.hidden_args import placeholder
from hf2triton.triton.install import Installation

# APIs that change server state stay closed unless the caller has the key from the (0600) state file.
RESTRICTED_HTTP_APIS = "model-repository,shared-memory,trace,logging"
RESTRICTED_KEY_HEADER = "hf2triton-admin"
REPOSITORY = "model_repository"  # the rendered repository, relative to the project directory


@dataclass
class Settings:
    """One server of ours: the config's server spec, the repository it serves, the work directory (state,
    log, backends) and the models it loads."""

    server: ServerSpec
    repository: str
    work: str
    models: list[str]

    def __post_init__(self) -> None:
        self.repository = str(Path(self.repository).resolve())
        self.work = str(Path(self.work).resolve())
        self.models = list(self.models)

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def ports(self) -> dict[str, int]:
        return self.server.ports

    @property
    def server_dir(self) -> Path:
        return Path(self.work) / "server"

    @property
    def state_file(self) -> Path:
        return self.server_dir / "state.json"

    @property
    def log_file(self) -> Path:
        return self.server_dir / "tritonserver.log"

    @property
    def client_host(self) -> str:
        return client_address(self.host)

    def url(self, port_key: str = "http_port") -> str:
        address = f"[{self.client_host.strip('[]')}]" if ":" in self.client_host else self.client_host
        return f"{address}:{self.ports[port_key]}"

    @property
    def urls(self) -> dict[str, str]:
        """host:port per protocol, for clients on this machine."""
        return {"http": self.url(), "grpc": self.url("grpc_port"), "metrics": self.url("metrics_port")}

    @property
    def endpoints(self) -> dict[str, str]:
        """What a user connects to (reports, status, messages)."""
        return {"http": f"http://{self.url()}", "grpc": self.url("grpc_port"), "metrics": f"http://{self.url('metrics_port')}/metrics"}

    @classmethod
    def of(cls, server: ServerSpec, models: list[str], work: str, repository: str = REPOSITORY) -> Settings:
        return cls(server, repository, work, models)


def settings_of_spec(spec: dict[str, Any], base: Path | str = ".") -> Settings:
    """The settings a supervisor's spec file (serve's params) names; its relative paths are relative to `base`, the
    directory the supervisor runs in (serve's: the project directory)."""
    server = from_param(ServerSpec, spec["server"])
    return Settings.of(server, spec["models"], str(Path(base, spec["work"])), str(Path(base, spec["repository"])))


def client_address(bind_host: str) -> str:
    """Where a local client connects to a server bound to `bind_host`: loopback for all addresses."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(bind_host, bind_host)  # noqa: S104


def restricted_arguments(admin_key: str, client_key: str) -> dict[str, str]:
    """The flags that carry the admin key and the client key (client.KEY_HEADER: metadata, inference,
    model-config, statistics), by the environment variable that passes each to the server (hidden_args: the
    command line holds placeholders; /proc/<pid>/cmdline is world-readable). Health stays open."""
    admin = f"{RESTRICTED_HTTP_APIS}:{RESTRICTED_KEY_HEADER}={admin_key}"
    clients = f"{client.CLIENT_KEY_APIS}:{client.KEY_HEADER}={client_key}"
    return {
        "HF2TRITON_ARG_HTTP_RESTRICTED_API": f"--http-restricted-api={admin}",
        "HF2TRITON_ARG_GRPC_RESTRICTED_PROTOCOL": f"--grpc-restricted-protocol={admin}",
        "HF2TRITON_ARG_HTTP_CLIENT_API": f"--http-restricted-api={clients}",
        "HF2TRITON_ARG_GRPC_CLIENT_PROTOCOL": f"--grpc-restricted-protocol={clients}",
    }


def listen_addresses(host_address: str) -> dict[str, str]:
    """The address flags tritonserver understands: its HTTP and metrics servers (libevhtp) read an IPv6
    address only as `ipv6:<addr>` (a bare `::1` binds 255.255.255.255), its gRPC server only as `[<addr>]`."""
    bare = host_address.strip("[]")
    if ":" not in bare:
        return {"http": bare, "grpc": bare}
    return {"http": f"ipv6:{bare}", "grpc": f"[{bare}]"}


def server_command(install: Installation, settings: Settings, backend_dir: str, admin_key: str) -> list[str]:
    """The command as /proc/<pid>/cmdline shows it (kept in the state file): placeholders instead of the
    key-carrying flags; start_server passes the real flags in the environment."""
    addresses = listen_addresses(settings.host)
    cmd = [
        install.binary,
        f"--model-repository={settings.repository}",
        "--model-control-mode=explicit",
        *[f"--load-model={name}" for name in settings.models],
        f"--backend-directory={backend_dir}",
        f"--http-address={addresses['http']}",
        f"--http-port={settings.server.http_port}",
        f"--grpc-address={addresses['grpc']}",
        f"--grpc-port={settings.server.grpc_port}",
        f"--metrics-address={addresses['http']}",
        f"--metrics-port={settings.server.metrics_port}",
        f"--log-verbose={settings.server.log_verbose}",
        "--exit-on-error=false",  # one model failing to load must not take the others down
        "--exit-timeout-secs=10",
        "--strict-readiness=true",
        f"--backend-config=python,shm-default-byte-size={settings.server.shm_default_byte_size}",
        *[placeholder(name) for name in restricted_arguments(admin_key, "")],  # the keys stay off /proc/<pid>/cmdline
    ]
    if not host.has_gpu():
        cmd.append("--allow-gpu-metrics=false")
    if len(vllm_models(settings)) > 1:
        # vLLM sizes its KV cache from the GPU memory it sees used while it profiles: two engines starting together
        # each count the other's allocations as their own, and the second fails ("No available memory for the cache
        # blocks", on one H100). Loaded one after the other, each sees the other's memory as taken before it starts.
        cmd.append("--model-load-thread-count=1")
    return cmd


def vllm_models(settings: Settings) -> list[str]:
    """The served models on backend vllm (their rendered config.pbtxt's `backend` parameter; unreadable: not counted)."""
    from .modelconfig import read_model_config_or_none

    found = []
    for name in settings.models:
        config = read_model_config_or_none(Path(settings.repository) / name / "config.pbtxt")
        if config is not None and "backend" in config.parameters and config.parameters["backend"].string_value == "vllm":
            found.append(name)
    return found


def redacted_command(cmd: list[str]) -> list[str]:
    """The command line without an admin key (for logs and reports). Ours hold placeholders only; this also
    masks the key of a server started by an older hf2triton (so that one counts as changed and restarts)."""
    return [arg.rsplit("=", 1)[0] + "=***" if f"{RESTRICTED_KEY_HEADER}=" in arg else arg for arg in cmd]


LOCK_WAIT_S = 300  # beyond server.startup_timeout_s: how long a second serve/validate/bench/stop waits for the first


def serving_lock(settings: Settings) -> Any:
    """One start, restart or stop of this work directory's servers (tritonserver and gateway) at a time: two
    `serve` after a crash would otherwise both start one (the second then sees the first's server and keeps it)."""
    wait = settings.server.startup_timeout_s + LOCK_WAIT_S
    return exclusive(settings.server_dir / "serve.lock", wait, f"starting or stopping the server in {settings.work}")
