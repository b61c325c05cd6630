#!/usr/bin/python3
"""SPACE's Code Interpreter server, started by the code-interpreter-v1 template (templates/).

Speaks what the published ``@e2b/code-interpreter`` SDK sends to port 49999, over Jupyter kernels
run by Debian's jupyter_client (no Jupyter server in between):

  GET    /health                -> 200 "OK"
  POST   /execute               {code, context_id?, language?, env_vars?} -> 200, NDJSON lines
  POST   /contexts              {language?, cwd?} -> 200 {id, language, cwd}
  GET    /contexts              -> 200 [{id, language, cwd}]
  POST   /contexts/<id>/restart -> 200 null
  DELETE /contexts/<id>         -> 200 null

/execute lines, one JSON object each: ``number_of_executions`` first when the kernel took the
code, then ``stdout``/``stderr`` (text as printed, timestamp), ``result`` (is_main_result and one
key per format: text, html, markdown, svg, png, jpeg, pdf, latex, json, javascript; other MIME
types under ``extra``), ``error`` (name, value, traceback), ``keepalive`` after 5 s of silence,
and ``end_of_execution`` last. Errors before the stream are text/plain: 400 bad request, 404
unknown context, 500 kernel failure.

A context is one kernel (its id is the kernel's id); one execution at a time per context. A
client that leaves mid-execution (its timeout) gets the kernel interrupted, so the next call
runs. Per-call env_vars are set in the kernel's os.environ for that call and restored afterwards.
Only Python kernels: Debian packages no JavaScript kernel (see docs/e2b.md).

Python 3.11 stdlib plus jupyter_client 7 (Debian bookworm). Listens on 0.0.0.0:$SPACE_CI_PORT
(default 49999); every request is logged to stderr.
"""

import json
import os
import queue
import select
import socket
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from jupyter_client.multikernelmanager import MultiKernelManager

PORT = int(os.environ.get("SPACE_CI_PORT", "49999"))
DEFAULT_CWD = os.environ.get("SPACE_CI_CWD", "/home/user")
KEEPALIVE_S = 5.0
#: How often a silent execution checks whether its client is still there, seconds.
POLL_S = 0.25
#: Longest wait for a kernel to answer after a start or restart, seconds.
KERNEL_READY_S = 60
#: Longest wait for an interrupted kernel to go idle, seconds.
INTERRUPT_DRAIN_S = 10
#: Run silently in every new kernel: plain tracebacks, inline charts, the usual imports loaded
#: (so the first call of a warm sandbox does not pay for them).
KERNEL_SETUP = """
get_ipython().run_line_magic('colors', 'NoColor')
get_ipython().run_line_magic('matplotlib', 'inline')
import numpy, pandas, matplotlib.pyplot
"""
FORMATS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


class HttpError(Exception):
    def __init__(self, status, text):
        super().__init__(text)
        self.status = status
        self.text = text


class ClientGone(Exception):
    """The caller closed its connection (its timeout) while an execution ran."""


def normalise_language(language):
    lang = (language or "python").strip().lower() or "python"
    return {"js": "javascript", "ts": "typescript", "python3": "python"}.get(lang, lang)


class Context:
    """One kernel: its id, language, cwd and the lock that runs one execution at a time."""

    def __init__(self, kernels, language, cwd):
        self.language = language
        self.cwd = cwd
        self.kernels = kernels
        self.lock = threading.Lock()
        self.generation = 0
        self.id = kernels.start_kernel(kernel_name="python3", cwd=cwd)
        self.manager = kernels.get_kernel(self.id)
        self.client = None
        self._connect()

    def _connect(self):
        if self.client is not None:
            self.client.stop_channels()
        self.client = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=KERNEL_READY_S)
        self.run_silent(KERNEL_SETUP)

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def run_silent(self, code, timeout=KERNEL_READY_S):
        """Runs code without output or history; waits for the kernel to be idle again."""
        msg_id = self.client.execute(code, silent=True, store_history=False, allow_stdin=False)
        self._wait_idle(msg_id, timeout)

    def _wait_idle(self, msg_id, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.client.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return True
        return False

    def restart(self):
        self.generation += 1
        self.manager.restart_kernel(now=True)
        self._connect()

    def shutdown(self):
        self.generation += 1
        try:
            self.client.stop_channels()
        finally:
            self.kernels.shutdown_kernel(self.id, now=True)

    def execute(self, code, env_vars, send, client_gone):
        """Runs code, calling send(line) for every line; raises ClientGone when the caller left."""
        with self.lock:
            generation = self.generation
            if env_vars:
                self.run_silent(
                    "import os as _space_os\n"
                    f"_space_env_before = {{k: _space_os.environ.get(k) for k in {list(env_vars)!r}}}\n"
                    f"_space_os.environ.update({dict(env_vars)!r})\n"
                )
            try:
                self._execute(code, generation, send, client_gone)
            finally:
                if env_vars and self.generation == generation:
                    self.run_silent(
                        "for _k, _v in _space_env_before.items():\n"
                        "    _space_os.environ.pop(_k, None) if _v is None else _space_os.environ.__setitem__(_k, _v)\n"
                        "del _space_env_before, _k, _v\n"
                    )

    def _execute(self, code, generation, send, client_gone):
        msg_id = self.client.execute(code, silent=False, store_history=True, allow_stdin=False, stop_on_error=True)
        last_sent = time.monotonic()
        errored = False
        try:
            while True:
                if self.generation != generation:
                    send({"type": "error", "name": "ContextRestarting", "value": "Context was restarted", "traceback": ""})
                    return
                try:
                    msg = self.client.get_iopub_msg(timeout=POLL_S)
                except queue.Empty:
                    if client_gone():
                        raise ClientGone()
                    if time.monotonic() - last_sent >= KEEPALIVE_S:
                        send({"type": "keepalive"})
                        last_sent = time.monotonic()
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                line = None
                if kind == "execute_input":
                    line = {"type": "number_of_executions", "execution_count": content.get("execution_count")}
                elif kind == "stream":
                    stamp = msg["header"].get("date")
                    line = {
                        "type": "stderr" if content.get("name") == "stderr" else "stdout",
                        "text": content.get("text", ""),
                        "timestamp": stamp.isoformat() if hasattr(stamp, "isoformat") else stamp,
                    }
                elif kind in ("execute_result", "display_data"):
                    line = result_line(content.get("data", {}), kind == "execute_result")
                elif kind == "error":
                    errored = True
                    line = {
                        "type": "error",
                        "name": content.get("ename", ""),
                        "value": content.get("evalue", ""),
                        "traceback": "\n".join(content.get("traceback", [])),
                    }
                elif kind == "status" and content.get("execution_state") == "idle":
                    break
                if line is not None:
                    send(line)
                    last_sent = time.monotonic()
            reply = self._reply(msg_id)
            if reply is not None and reply.get("status") == "aborted" and not errored:
                send({"type": "error", "name": "ExecutionAborted", "value": "Execution was aborted", "traceback": ""})
        except (ClientGone, BrokenPipeError, ConnectionResetError):
            # the caller's timeout: stop the code so the context's next call runs
            self.manager.interrupt_kernel()
            self._wait_idle(msg_id, INTERRUPT_DRAIN_S)
            self._reply(msg_id)
            raise ClientGone()

    def _reply(self, msg_id):
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                msg = self.client.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]
        return None


def result_line(data, main):
    line = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in data.items():
        key = FORMATS.get(mime)
        if key is None:
            extra[mime] = value
        elif key == "text":
            line[key] = strip_quotes(value)
        else:
            line[key] = value
    if extra:
        line["extra"] = extra
    return line


def strip_quotes(text):
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


class Contexts:
    """Every context, the per-language defaults among them."""

    def __init__(self):
        runtime = tempfile.mkdtemp(prefix="space-kernels-")  # connection files, 0700
        self.kernels = MultiKernelManager(connection_dir=runtime)
        self.by_id = {}
        self.defaults = {}
        self.lock = threading.Lock()

    def create(self, language, cwd):
        language = normalise_language(language)
        if language != "python":
            raise HttpError(400, f"Language {language} is not available in this sandbox: only python kernels are")
        try:
            ctx = Context(self.kernels, language, cwd or DEFAULT_CWD)
        except Exception as err:  # noqa: BLE001 - any kernel failure is the caller's 500
            raise HttpError(500, f"Failed to start a {language} kernel: {err}") from err
        with self.lock:
            self.by_id[ctx.id] = ctx
        return ctx

    def default(self, language):
        language = normalise_language(language)
        with self.lock:
            ctx = self.defaults.get(language)
        if ctx is not None and ctx.id in self.by_id:
            return ctx
        ctx = self.create(language, DEFAULT_CWD)
        with self.lock:
            self.defaults[language] = ctx
        return ctx

    def get(self, context_id):
        with self.lock:
            ctx = self.by_id.get(context_id)
        if ctx is None:
            raise HttpError(404, f"Context {context_id} not found")
        return ctx

    def remove(self, context_id):
        ctx = self.get(context_id)
        with self.lock:
            self.by_id.pop(context_id, None)
            for lang, d in list(self.defaults.items()):
                if d is ctx:
                    del self.defaults[lang]
        ctx.shutdown()

    def list(self):
        with self.lock:
            return [c.describe() for c in self.by_id.values()]


CONTEXTS = Contexts()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "space-code-interpreter/1"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.log_date_time_string(), fmt % args))

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError as err:
            raise HttpError(400, f"The body is not JSON: {err}") from err
        if not isinstance(body, dict):
            raise HttpError(400, "The body must be a JSON object")
        return body

    def _send(self, status, payload, text=False):
        data = (payload if text else json.dumps(payload)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8" if text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Access-Control-Allow-Origin", "*")
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method):
        path = urlsplit(self.path).path.rstrip("/") or "/"
        try:
            if method == "GET" and path == "/health":
                return self._send(200, "OK")
            if method == "POST" and path == "/execute":
                return self._execute(self._body())
            if path == "/contexts":
                if method == "GET":
                    return self._send(200, CONTEXTS.list())
                if method == "POST":
                    body = self._body()
                    return self._send(200, CONTEXTS.create(body.get("language"), body.get("cwd")).describe())
            parts = path.split("/")
            if len(parts) == 4 and parts[1] == "contexts" and parts[3] == "restart" and method == "POST":
                CONTEXTS.get(parts[2]).restart()
                return self._send(200, None)
            if len(parts) == 3 and parts[1] == "contexts" and method == "DELETE":
                CONTEXTS.remove(parts[2])
                return self._send(200, None)
            raise HttpError(404, f"No route {method} {path}")
        except HttpError as err:
            self._send(err.status, err.text, text=True)

    def _execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            raise HttpError(400, "code must be a string")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
            raise HttpError(400, "env_vars must map names to strings")
        if body.get("context_id") and body.get("language"):
            raise HttpError(400, "Only one of context_id or language can be provided")
        if body.get("context_id"):
            ctx = CONTEXTS.get(body["context_id"])
        else:
            ctx = CONTEXTS.default(body.get("language"))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Access-Control-Allow-Origin", "*")
        self.end_headers()

        def send(line):
            data = (json.dumps(line) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            ctx.execute(code, env_vars, send, self._client_gone)
            send({"type": "end_of_execution"})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except ClientGone:
            self.close_connection = True

    def _client_gone(self):
        """True once the caller closed its end (readable with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    def do_DELETE(self):
        self._route("DELETE")


def main():
    # ipykernel's debugger warns about frozen modules on every kernel start otherwise
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    CONTEXTS.default("python")  # ready means a kernel answers: it is in the template's snapshot
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    server.daemon_threads = True
    sys.stderr.write(f"code interpreter listening on 0.0.0.0:{PORT}\n")
    sys.stderr.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
