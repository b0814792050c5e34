"""An emulated vLLM pod's OpenAI-compatible API on 127.0.0.1: the few routes a router needs.

    with VllmApiPod("meta-llama/Llama-3.1-8B-Instruct") as pod:
        pod.url                      # http://127.0.0.1:PORT
        pod.completions              # how many completion requests reached this pod

Routes (as vLLM's API server answers them): `GET /health` (200, empty), `GET /v1/models` (the
served model), `POST /v1/completions` and `POST /v1/chat/completions` (a one-token answer with
`usage`), `GET /metrics` (the emulated vLLM 0.33 payload, each completion recorded as a request).
Anything else is 404, as on vLLM, so a router that probes optional routes sees what it would see.
"""
from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Any, Self

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from emulator.cluster.exposition import render_python_client
from emulator.cluster.pod_metrics import PodIdentity, RequestOutcome, VllmPodMetrics


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        pod = self.server.pod
        if path == "/health":
            self._send(200, b"", "text/plain; charset=utf-8")
        elif path == "/v1/models":
            self._json({"object": "list", "data": [{"id": pod.model, "object": "model", "created": 0,
                                                    "owned_by": "vllm", "root": pod.model,
                                                    "max_model_len": pod.max_model_len}]})
        elif path == "/metrics":
            self._send(200, render_python_client(pod.metrics.snapshot()), CONTENT_TYPE_LATEST)
        else:
            self._send(404, b'{"detail":"Not Found"}', "application/json")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, b'{"detail":"invalid JSON"}', "application/json")
            return
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, b'{"detail":"Not Found"}', "application/json")
            return
        self._json(self.server.pod.complete(path, body))

    def _json(self, obj: dict[str, Any]) -> None:
        self._send(200, json.dumps(obj).encode(), "application/json")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # silence per-request logs
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, pod: VllmApiPod) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.pod = pod


class VllmApiPod:
    def __init__(self, model: str = "meta-llama/Llama-3.1-8B-Instruct", max_model_len: int = 8192) -> None:
        self.model, self.max_model_len = model, max_model_len
        self.metrics = VllmPodMetrics(PodIdentity(model_name=model, max_model_len=max_model_len), time.time())
        self.completions = 0
        self._lock = threading.Lock()
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def complete(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt") if path == "/v1/completions" else json.dumps(body.get("messages"))
        tokens = max(1, len(str(prompt or "").split()))
        with self._lock:
            self.completions += 1
            n = self.completions
        self.metrics.record(RequestOutcome(prompt_tokens=tokens, gpu_hit_tokens=0, cpu_hit_tokens=0,
                                           l2_hit_tokens=0, output_tokens=1, ttft_s=0.01))
        usage = {"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1}
        if path == "/v1/completions":
            return {"id": f"cmpl-{n}", "object": "text_completion", "created": int(time.time()), "model": self.model,
                    "choices": [{"index": 0, "text": " ok", "logprobs": None, "finish_reason": "length"}],
                    "usage": usage}
        return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()), "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                             "finish_reason": "length"}], "usage": usage}

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
