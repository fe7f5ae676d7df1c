"""A loopback Kubernetes API: the part of /api/v1 that dagster-k8s's PipesK8sClient (0.29.27) calls, and a pod
that is a local process.

Endpoints: create a pod (POST .../namespaces/{ns}/pods), list pods (GET .../pods?fieldSelector=metadata.name=X,
which `wait_for_pod` polls), read one (GET .../pods/{name}), its log (GET .../pods/{name}/log with follow,
timestamps, sinceSeconds, tailLines, container), delete it (DELETE .../pods/{name}), and list events
(GET .../namespaces/{ns}/events?fieldSelector=involvedObject.name=X, read for a pod's debug information).
Anything else answers 404 and is kept in `unknown`, so a test can assert the client needed nothing more.

A created pod is Pending (container waiting, ContainerCreating) for `pending_seconds`, then its first
container's command runs here as a subprocess, with this process's environment plus the container's `env`
(how the Pipes context and message channel reach the process) in its `workingDir`: Running and ready while it
runs, then terminated with its exit code (phase Succeeded or Failed). Its stdout and stderr, line by line with
kubelet's fixed-width nanosecond timestamps, are the pod's log. An image listed in `pull_fails` never
starts: the container waits with ErrImagePull and a Warning event says why. The image is otherwise ignored:
the command runs on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tests.loopback import ThreadedServer


def kube_time(ns: int) -> str:
    """An RFC 3339 time with 9 fraction digits, as kubelet stamps log lines."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{fraction:09d}Z"


def go_bool(value: str | None) -> bool:
    """A query flag read as the API server's Go does (the Python client sends 'True')."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def iso_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_kubeconfig(path: Path, server: str, token: str, namespace: str = "") -> Path:
    """A kubeconfig with one context, current: `server`, a bearer `token`, and `namespace` if given."""
    context = {"cluster": "fake", "user": "fake", **({"namespace": namespace} if namespace else {})}
    path.write_text(json.dumps({  # JSON is YAML
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": context}]}))
    return path


class FakePod:
    """One created pod: its body as received, its container's state, its log, and the process behind it."""

    def __init__(self, body: dict, namespace: str, pull_fails: set[str], pending_seconds: float):
        self.body, self.namespace, self.name = body, namespace, body["metadata"]["name"]
        self.container = body["spec"]["containers"][0]
        self.body["metadata"].update(namespace=namespace, uid=f"uid-{self.name}", creationTimestamp=iso_now())
        self.phase, self.state, self.ready = "Pending", {"waiting": {"reason": "ContainerCreating"}}, False
        self.log: list[tuple[int, bytes]] = []  # (ns since the epoch, one line with its newline)
        self.events: list[dict] = []
        self.finished = threading.Event()  # no more log lines will come
        self.changed = threading.Condition()
        self.process: subprocess.Popen | None = None
        self.deleted = threading.Event()
        self.starting = threading.Lock()  # a deleted pod starts no process
        self.thread = threading.Thread(target=self._run, args=(pull_fails, pending_seconds), daemon=True)
        self.thread.start()

    def _run(self, pull_fails: set[str], pending_seconds: float) -> None:
        image = self.container.get("image", "")
        if self.deleted.wait(pending_seconds) or image in pull_fails:
            if not self.deleted.is_set():
                self._pull_failed(image)
            self.finished.set()
            return
        env = {**os.environ, **{e["name"]: e.get("value", "") for e in self.container.get("env", [])}}
        with self.starting:
            if self.deleted.is_set():
                self.finished.set()
                return
            try:
                self.process = subprocess.Popen(self.container["command"], env=env, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, cwd=self.container.get("workingDir"))
            except OSError as error:  # kubelet: the container could not start
                self._terminate(128, "StartError", str(error))
                return
        started = iso_now()
        self.phase, self.state, self.ready = "Running", {"running": {"startedAt": started}}, True
        readers = [threading.Thread(target=self._read, args=(stream,), daemon=True)
                   for stream in (self.process.stdout, self.process.stderr)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        code = self.process.wait()
        self._terminate(code, "Completed" if code == 0 else "Error", None, started)

    def _pull_failed(self, image: str) -> None:
        message = f'Failed to pull image "{image}": manifest unknown'
        self.state = {"waiting": {"reason": "ErrImagePull", "message": message}}
        self.events.append({"metadata": {"name": f"{self.name}.pull", "namespace": self.namespace},
                            "involvedObject": {"kind": "Pod", "name": self.name, "namespace": self.namespace},
                            "type": "Warning", "reason": "Failed", "message": message, "count": 1})

    def _read(self, stream) -> None:
        for line in iter(stream.readline, b""):
            with self.changed:
                stamp = max(time.time_ns(), self.log[-1][0] + 1 if self.log else 0)  # kubelet's are distinct
                self.log.append((stamp, line if line.endswith(b"\n") else line + b"\n"))
                self.changed.notify_all()
        stream.close()

    def _terminate(self, code: int, reason: str, message: str | None, started: str | None = None) -> None:
        terminated = {"exitCode": code, "reason": reason, "startedAt": started or iso_now(), "finishedAt": iso_now()}
        if message:
            terminated["message"] = message
        self.phase, self.state, self.ready = ("Succeeded" if code == 0 else "Failed"), {"terminated": terminated}, False
        with self.changed:  # the state is final before the log ends, as kubelet's
            self.finished.set()
            self.changed.notify_all()

    def stop(self) -> None:
        """Delete: stop the process if it still runs (SIGTERM, then SIGKILL after a grace), end the log."""
        with self.starting:
            self.deleted.set()
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)  # seconds of grace
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.thread.join(15)
        with self.changed:
            self.finished.set()
            self.changed.notify_all()

    def as_json(self) -> dict:
        status = {"name": self.container["name"], "image": self.container.get("image", ""), "imageID": "",
                  "ready": self.ready, "restartCount": 0, "started": self.ready, "state": self.state}
        return {"apiVersion": "v1", "kind": "Pod", **self.body,
                "status": {"phase": self.phase, "containerStatuses": [status]}}

    def lines(self, timestamps: bool, start: int, end: int, since_seconds: str | None = None,
              tail_lines: str | None = None) -> bytes:
        """Log lines start..end, filtered and stamped as the API's query asks."""
        with self.changed:
            chosen = self.log[start:end]
        if since_seconds:
            oldest = time.time_ns() - int(since_seconds) * 1_000_000_000
            chosen = [(t, line) for t, line in chosen if t >= oldest]
        if tail_lines:
            chosen = chosen[-int(tail_lines):] if int(tail_lines) else []
        return b"".join((kube_time(t).encode() + b" " if timestamps else b"") + line for t, line in chosen)


class KubeHandler(BaseHTTPRequestHandler):
    """Routes a request to the FakeKube that serves it (`owner`)."""

    owner: FakeKube
    protocol_version = "HTTP/1.1"
    timeout = 5  # seconds an idle kept-alive connection is held

    def log_message(self, *args) -> None:
        pass

    def _route(self, method: str) -> None:
        self.owner.requests.append((method, self.path))
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Authorization") != f"Bearer {self.owner.token}":
            return self._status(401, "Unauthorized", "no or wrong bearer token")
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        if parts[:3] != ["api", "v1", "namespaces"] or len(parts) < 5:
            return self._unknown(method)
        namespace, kind, rest = parts[3], parts[4], parts[5:]
        route = (method, kind, len(rest), rest[1:])
        if route == ("GET", "events", 0, []):
            return self._list_events(namespace, query)
        if route == ("POST", "pods", 0, []):
            return self._json(201, self.owner.create(namespace, json.loads(body)).as_json())
        if route == ("GET", "pods", 0, []):
            return self._list_pods(namespace, query)
        if kind != "pods" or route not in (("GET", "pods", 1, []), ("DELETE", "pods", 1, []),
                                           ("GET", "pods", 2, ["log"])):
            return self._unknown(method)
        pod = self.owner.delete(namespace, rest[0]) if method == "DELETE" else self.owner.pods.get((namespace, rest[0]))
        if pod is None:
            return self._status(404, "NotFound", f'pods "{rest[0]}" not found')
        if rest[1:] == ["log"]:
            return self._log(pod, query)
        return self._json(200, pod.as_json())

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def _list_pods(self, namespace: str, query: dict) -> None:
        name = query.get("fieldSelector", "").removeprefix("metadata.name=")
        items = [p.as_json() for (ns, n), p in list(self.owner.pods.items()) if ns == namespace and n == name or
                 ns == namespace and not name]
        self._json(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})

    def _list_events(self, namespace: str, query: dict) -> None:
        name = query.get("fieldSelector", "").removeprefix("involvedObject.name=")
        pod = self.owner.pods.get((namespace, name))
        self._json(200, {"apiVersion": "v1", "kind": "EventList", "metadata": {},
                         "items": list(pod.events) if pod else []})

    def _log(self, pod: FakePod, query: dict) -> None:
        if "waiting" in pod.state:
            reason = pod.state["waiting"]["reason"]
            return self._status(400, "BadRequest", f'container "{pod.container["name"]}" in pod "{pod.name}" '
                                                   f"is waiting to start: {reason}")
        stamped, since, tail = go_bool(query.get("timestamps")), query.get("sinceSeconds"), query.get("tailLines")
        if not go_bool(query.get("follow")):
            return self._send(200, pod.lines(stamped, 0, len(pod.log), since, tail), "text/plain")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = len(pod.log)
        chunk = pod.lines(stamped, 0, sent, since, tail)
        try:
            while True:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                with pod.changed:
                    pod.changed.wait_for(lambda: len(pod.log) > sent or pod.finished.is_set(), timeout=1)
                    done, count = pod.finished.is_set(), len(pod.log)
                if done and count == sent:
                    break
                chunk, sent = pod.lines(stamped, sent, count), count
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client stopped following
            self.close_connection = True

    def _unknown(self, method: str) -> None:
        self.owner.unknown.append((method, self.path))
        self._status(404, "NotFound", f"the fake Kubernetes API does not serve {method} {self.path}")

    def _status(self, code: int, reason: str, message: str) -> None:
        self._json(code, {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message,
                          "reason": reason, "code": code})

    def _json(self, code: int, data: dict) -> None:
        self._send(code, json.dumps(data).encode(), "application/json")

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class FakeKube(ThreadedServer):
    """The loopback API server; `with FakeKube() as kube:` starts it and stops it with every pod's process."""

    token = "handhold-fake-token"
    handler = KubeHandler

    def __init__(self, pull_fails: tuple[str, ...] = (), pending_seconds: float = 0.3):
        self.pull_fails, self.pending_seconds = set(pull_fails), pending_seconds
        self.pods: dict[tuple[str, str], FakePod] = {}
        self.created: list[dict] = []  # pod bodies as the client sent them
        self.deleted: list[tuple[str, str]] = []  # (namespace, name)
        self.requests: list[tuple[str, str]] = []  # (method, path with query)
        self.unknown: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __enter__(self) -> FakeKube:
        return self.start()

    def close(self) -> None:
        for pod in list(self.pods.values()):
            pod.stop()
        super().close()

    def write_kubeconfig(self, path: Path, namespace: str = "") -> Path:
        """A kubeconfig whose current context is this server, with its bearer token and `namespace`."""
        return write_kubeconfig(path, self.url, self.token, namespace)

    def create(self, namespace: str, body: dict) -> FakePod:
        with self.lock:
            self.created.append(json.loads(json.dumps(body)))
            pod = self.pods[(namespace, body["metadata"]["name"])] = FakePod(
                body, namespace, self.pull_fails, self.pending_seconds)
        return pod

    def delete(self, namespace: str, name: str) -> FakePod | None:
        with self.lock:
            pod = self.pods.pop((namespace, name), None)
            if pod:
                self.deleted.append((namespace, name))
        if pod:
            pod.stop()
        return pod
