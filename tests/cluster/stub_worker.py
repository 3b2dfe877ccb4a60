"""A model-free stand-in for `radixagent serve`, for router tests (stdlib only, starts in ~0.1 s).

`python tests/cluster/stub_worker.py --host 127.0.0.1 --port P --name w0` answers what the routers
(sglang-router 0.3.x, smg 1.x) read to register and health-check a worker (/health, /server_info,
/model_info, /get_load, /v1/models) and serves POST /generate with no model: each answer's
`meta_info` carries `worker` (this stub's --name), the `X-SMG-Routing-Key` it received, and
`cached_tokens` = the longest character prefix this worker had already seen (a radix cache on
characters, capped at prompt - 1); a prompt containing `[[sleep=S]]` is answered after S seconds.
/get_server_info's `cache_stats.requests` counts /generate calls.
Any other flags (the ones `Cluster` passes to real workers) are ignored.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Stub:
    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.seen: list[str] = []
        self.requests = 0

    def generate(self, body: dict[str, Any], routing_key: str | None) -> dict[str, Any]:
        text = body.get("text")
        if not isinstance(text, str):
            text = " ".join(map(str, body.get("input_ids") or []))
        delay = re.search(r"\[\[sleep=([0-9.]+)\]\]", text)  # a slow call, to hold requests in flight
        if delay:
            time.sleep(float(delay.group(1)))
        with self.lock:
            cached = max((len(os.path.commonprefix([text, s])) for s in self.seen), default=0)
            self.seen.append(text)
            self.requests += 1
        prompt = len(text)
        return {
            "text": f" {self.name}",
            "output_ids": [1],
            "meta_info": {
                "id": f"{self.name}-{self.requests}",
                "prompt_tokens": prompt,
                "completion_tokens": 1,
                "cached_tokens": min(cached, max(0, prompt - 1)),
                "finish_reason": {"type": "length", "length": 1},
                "worker": self.name,
                "routing_key": routing_key,
            },
        }

    def flush(self) -> None:
        with self.lock:
            self.seen.clear()


def handler(stub: Stub) -> type[BaseHTTPRequestHandler]:
    info = {
        "model_path": "stub",
        "tokenizer_path": "stub",
        "served_model_name": "stub",
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "is_generation": True,
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, code: int, payload: Any = None) -> None:
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/health_generate"):
                self._send(200)
            elif path in ("/server_info", "/get_server_info"):
                load = {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
                self._send(
                    200,
                    {
                        **info,
                        "version": "stub",
                        "dp_size": 1,
                        "max_total_tokens": 1 << 20,
                        "max_running_requests": 64,
                        "load": load,
                        "model_info": info,
                        "cache_stats": {"requests": stub.requests},
                    },
                )
            elif path in ("/model_info", "/get_model_info"):
                self._send(200, info)
            elif path == "/get_load":
                self._send(200, [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}])
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
            elif path == "/flush_cache":
                stub.flush()
                self._send(200)
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if path == "/generate":
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._send(400, {"error": "bad json"})
                    return
                self._send(200, stub.generate(body, self.headers.get("X-SMG-Routing-Key")))
            elif path == "/flush_cache":
                stub.flush()
                self._send(200)
            else:
                self._send(404, {"error": "not found"})

    return Handler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", default="stub")
    ns, _ = p.parse_known_args()
    server = ThreadingHTTPServer((ns.host, ns.port), handler(Stub(ns.name)))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
