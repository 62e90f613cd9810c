"""A real Hugging Face hub-compatible server on 127.0.0.1 for tests: olah serving local git repositories,
fully offline (see shared/reference/environment.md for the configuration that works)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from hf2triton import host

ROOT = Path(__file__).resolve().parent.parent


def olah_binary() -> str | None:
    candidate = os.environ.get("HF2TRITON_OLAH", str(ROOT / ".venv-hub" / "bin" / "olah-cli"))
    return candidate if os.access(candidate, os.X_OK) else None


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout.strip()


class HubServer:
    def __init__(self, root: Path):
        self.root = root
        self.repos = root / "repos"
        self.port = host.free_port()
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_repo(self, repo_id: str, files_from: Path) -> str:
        """Create (or add a commit to) a model repository; returns the commit hash."""
        path = self.repos / "models" / repo_id
        if not (path / ".git").is_dir():
            path.mkdir(parents=True)
            git("init", "-q", "-b", "main", cwd=path)
        for source in files_from.rglob("*"):
            if source.is_file():
                target = path / source.relative_to(files_from)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        git("add", "-A", cwd=path)
        git("commit", "-q", "--allow-empty", "-m", "update", cwd=path)
        return git("rev-parse", "HEAD", cwd=path)

    def start(self) -> None:
        binary = olah_binary()
        assert binary, "olah-cli not installed"
        (self.root / "mirrors").mkdir(parents=True, exist_ok=True)
        config = self.root / "olah.toml"
        config.write_text(
            "[basic]\n"
            f'host = "127.0.0.1"\nport = {self.port}\nrepos-path = "{self.root / "cache"}"\n'
            f'mirror-scheme = "http"\nmirror-netloc = "127.0.0.1:{self.port}"\nmirror-lfs-netloc = "127.0.0.1:{self.port}"\n'
            f'mirrors-path = ["{self.repos}"]\n'
            "[accessibility]\noffline = true\n"
        )
        log = open(self.root / "olah.log", "wb")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [binary, "-c", str(config), "--log-path", str(self.root / "logs")], stdout=log, stderr=subprocess.STDOUT, cwd=self.root
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.endpoint}/api/models/none/none/revision/main", timeout=1)  # noqa: S310
                return
            except urllib.error.HTTPError:
                return  # it answers
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"olah did not start: {(self.root / 'olah.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
