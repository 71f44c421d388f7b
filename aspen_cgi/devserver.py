"""`aspen dev`: gunicorn serving a directory of repositories on localhost,
creating a small demo repository when the directory is empty."""

from __future__ import annotations

import os
import socket
import tempfile

from .git import gitexec


def make_demo(root: str) -> str:
    """A bare `demo.git` with a few commits, a branch and a tag. Its config
    allows nothing: whether pushes are, `serve` says for every repository."""
    bare = os.path.join(root, "demo.git")
    with tempfile.TemporaryDirectory() as work:
        env = gitexec.child_env(None, GIT_AUTHOR_NAME="Aspen Demo", GIT_AUTHOR_EMAIL="demo@example.com",
                                GIT_COMMITTER_NAME="Aspen Demo", GIT_COMMITTER_EMAIL="demo@example.com")
        gitexec.git(["init", "-q", "-b", "main", work], cwd=root, env=env)
        for i, text in enumerate(["Hello from Aspen.\n", "Served by a drop-in git http-backend.\n"]):
            with open(os.path.join(work, "README"), "a") as f:
                f.write(text)
            gitexec.git(["add", "README"], cwd=work, env=env)
            gitexec.git(["commit", "-q", "-m", f"demo commit {i + 1}"], cwd=work, env=env)
        gitexec.git(["tag", "-a", "v1.0", "-m", "demo tag"], cwd=work, env=env)
        gitexec.git(["branch", "topic"], cwd=work, env=env)
        gitexec.git(["clone", "-q", "--bare", work, bare], cwd=root, env=env)
    return bare


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve(root: str, host: str, port: int, workers: int, allow_push: bool = True) -> int:
    from gunicorn.app.base import BaseApplication  # startup

    root = os.path.abspath(root)
    os.makedirs(root, exist_ok=True)
    repos = sorted(n for n in os.listdir(root) if not n.startswith("."))
    if not repos:
        make_demo(root)
        repos = ["demo.git"]
    os.environ["GIT_PROJECT_ROOT"] = root
    os.environ["GIT_HTTP_EXPORT_ALL"] = "1"
    if allow_push:
        os.environ.setdefault("GIT_CONFIG_COUNT", "0")
        n = int(os.environ["GIT_CONFIG_COUNT"])
        os.environ[f"GIT_CONFIG_KEY_{n}"] = "http.receivepack"
        os.environ[f"GIT_CONFIG_VALUE_{n}"] = "true"
        os.environ["GIT_CONFIG_COUNT"] = str(n + 1)
    if port == 0:
        port = _free_port(host)
    from .wsgi import application  # startup

    class Dev(BaseApplication):
        def load_config(self):
            self.cfg.set("bind", f"{host}:{port}")
            self.cfg.set("workers", workers)
            self.cfg.set("worker_class", "gthread")
            self.cfg.set("threads", 8)
            self.cfg.set("timeout", 300)
            self.cfg.set("accesslog", None)
            self.cfg.set("when_ready", announce)        # once the socket listens: a client may connect at once

        def load(self):
            return application

    def announce(_server) -> None:
        print(f"Aspen serving {root} on http://{host}:{port}/", flush=True)
        for name in repos:
            print(f"  git clone http://{host}:{port}/{name}", flush=True)

    Dev().run()
    return 0
