"""A Kubernetes API server's few REST paths that lab.host.places.k8s.runner calls through the
official client, over real HTTP on 127.0.0.1, answering with objects captured from real
clusters (tests/fixtures/k8s/api/, each source named in its README). No API server can
run on this machine; this stands in for the paths only:
  POST/GET/DELETE /apis/{group}/{version}/namespaces/{ns}/{plural}[/{name}]
  GET /api/v1/namespaces/{ns}/pods?labelSelector=k=v[,k=v]
  GET /api/v1/namespaces/{ns}/pods/{name}/log?follow=true&container=c
What it adds to the captured objects is what a server or an operator writes itself:
the created object echoed back (an API server returns what it stored), the pods'
metadata (their names and the operator's labels, lab.host.places.k8s.cluster), and a 404
Status for what does not exist."""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import yaml

API = Path(__file__).parent / "fixtures" / "k8s" / "api"
CUSTOM = re.compile(r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")


def captured(name: str):
    """A fixture as the API server sends it: JSON, times as RFC 3339 strings (YAML reads an
    unquoted time, as kubectl's docs print some, as a datetime)."""
    text = (API / name).read_text()
    obj = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    return json.loads(json.dumps(obj, default=lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")))


def pod(name: str, labels: dict, status: dict, spec: dict | None = None) -> dict:
    """A pod as the operator names and labels it, with a captured status."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                            "labels": labels},
            "spec": spec or {"containers": []}, "status": status}


@dataclass
class Scenario:
    """What the cluster does with the job it is given. `pods(job)`: the pods of the created
    job (its body); `log(job)`: rank 0's log lines; `status`: the job's status once the
    log has been served (or at once, with `status_now`); `hold_log`: the log stays open
    until the job is deleted (a job that runs past its deadline); `logs_before_status`: the
    status waits for that many logs served (a container the operator reran)."""
    pods: object = None
    log: object = None
    status: dict | None = None
    status_now: bool = False
    hold_log: bool = False
    logs_before_status: int = 1
    logs: int = 0
    requests: list = field(default_factory=list)
    jobs: dict = field(default_factory=dict)
    deleted: list = field(default_factory=list)
    log_served: threading.Event = field(default_factory=threading.Event)
    gone: threading.Event = field(default_factory=threading.Event)


class Handler(BaseHTTPRequestHandler):
    scenario: Scenario

    def log_message(self, *args):
        pass

    def reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def missing(self, what: str) -> None:
        self.reply(404, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": f"{what} not found", "reason": "NotFound", "code": 404})

    def do_POST(self):
        sc, url = self.scenario, urlparse(self.path)
        sc.requests.append(("POST", url.path))
        m = CUSTOM.match(url.path)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body["metadata"]["namespace"] = m.group(3)
        name = body["metadata"]["name"]
        # A job deleted with Foreground propagation stays visible until its pods are gone
        # (Kubernetes' garbage-collection docs): a new job of its name meets it, so any
        # name this server has seen is taken.
        if name in sc.jobs:
            return self.reply(409, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "message": f'{m.group(4)}.{m.group(1)} "{name}" already exists',
                                    "reason": "AlreadyExists", "code": 409})
        sc.log_served.clear()
        sc.logs = 0
        sc.gone.clear()
        sc.jobs[name] = body
        self.reply(201, body)

    def do_GET(self):
        sc, url = self.scenario, urlparse(self.path)
        query = parse_qs(url.query)
        sc.requests.append(("GET", url.path, {k: v[0] for k, v in query.items()}))
        if m := CUSTOM.match(url.path):
            job = sc.jobs.get(m.group(5))
            if job is None or m.group(5) in sc.deleted:
                return self.missing(f'{m.group(4)}.{m.group(1)} "{m.group(5)}"')
            shown = dict(job)
            if sc.status is not None and (sc.status_now or (sc.log_served.is_set()
                                                            and sc.logs >= sc.logs_before_status)):
                shown["status"] = sc.status
            return self.reply(200, shown)
        if m := PODS.match(url.path):
            wanted = dict(kv.split("=", 1) for kv in query.get("labelSelector", [""])[0].split(",") if kv)
            items = []
            for job in sc.jobs.values():
                if job["metadata"]["name"] not in sc.deleted:
                    items += [p for p in sc.pods(job)
                              if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
            return self.reply(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
        if m := LOG.match(url.path):
            pod = url.path.rstrip("/").split("/")[-2]      # .../pods/<pod>/log
            job = next(j for name, j in sc.jobs.items() if pod.startswith(name + "-"))
            # Chunked, a chunk per line, as a Go server streams a body it flushes without a
            # Content-Length (Go's net/http/internal/chunked.go: "The http package adds
            # chunking automatically if handlers don't set a Content-Length header"): the
            # client reads each line as it comes, not 4 KiB at a time.
            self.protocol_version = "HTTP/1.1"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            for line in sc.log(job):
                data = (line + "\n").encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            if sc.hold_log:
                sc.gone.wait(60)
            self.wfile.write(b"0\r\n\r\n")
            self.close_connection = True
            sc.logs += 1
            sc.log_served.set()
            return None
        return self.missing(url.path)

    def do_DELETE(self):
        sc, url = self.scenario, urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        sc.requests.append(("DELETE", url.path, parse_qs(url.query), body))
        m = CUSTOM.match(url.path)
        if m.group(5) not in sc.jobs or m.group(5) in sc.deleted:
            return self.missing(m.group(5))
        sc.deleted.append(m.group(5))
        sc.gone.set()
        return self.reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


class FakeAPI:
    """The server in a thread; `kubeconfig(path)` writes a kubeconfig that points at it."""

    def __init__(self, scenario: Scenario):
        handler = type("H", (Handler,), {"scenario": scenario})
        self.scenario = scenario
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.scenario.gone.set()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "lab-test",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "contexts": [{"name": "lab-test", "context": {"cluster": "fake", "user": "tester",
                                                          "namespace": namespace}}],
            "users": [{"name": "tester", "user": {"token": "not-a-secret"}}]}))
        return path
