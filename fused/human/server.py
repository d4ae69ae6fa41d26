"""The page a person plays on (`play.py human`), served on localhost by the standard library's
threading HTTP server: nothing from the client names a file, and no request reaches beyond
this machine.

    GET  /             the page (page.html beside this file)
    GET  /state        the game as JSON (`Session.view`)
    POST /claim        {}: the game as JSON and a TOKEN; the asking tab is the one that plays
                       (a second tab takes over; the first is told so)
    POST /key          {"key": NAME, "tab": TOKEN}: one step (`keys.key_name` names)
    POST /new          {"seed": INT, "tab": TOKEN}: a new game (the running episode stays
                       recorded, cut)

Steps are taken one at a time under a lock, each written to the dataset before its answer.
Only this machine's pages play: a request naming another Host (a rebound DNS name) is refused,
as is a POST from another Origin; POSTs must be JSON (a cross-site page cannot send JSON
without a preflight, which is never granted), and nothing plays before a tab has claimed.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import secrets
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

from fused.human.session import Session

PAGE = Path(__file__).with_name("page.html")
MAX_BODY = 4096


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # SO_REUSEADDR: a restart binds at once over the last run's TIME_WAIT connections (closed
    # by the server after refusing a request); a port another server listens on is still an
    # error, as SO_REUSEPORT (never set) alone would share it
    allow_reuse_address = True

    def __init__(self, host: str, port: int, session: Session):
        super().__init__((host, port), Handler)
        self.session = session
        self.owner: str | None = None  # the tab that plays
        self.owner_lock = threading.Lock()

    def handle_error(self, request, client_address) -> None:
        """A client that went away mid-answer (a closed tab, a reload) is no error; anything
        else is one line on the console, not a traceback."""
        e = sys.exc_info()[1]
        if not isinstance(e, ConnectionError):
            self.session.say(f"a request from {client_address[0]} failed: "
                             f"{type(e).__name__}: {e}")

    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"


def _loopback(name: str) -> bool:
    """`localhost` or a loopback IP address (not a DNS name that merely starts with 127.)."""
    try:
        return name == "localhost" or ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # the console shows steps, not requests
        pass

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj: dict) -> None:
        self._send(code, json.dumps(obj).encode(), "application/json")

    def _view(self) -> dict:
        v = self.server.session.view()
        v["frame"] = "data:image/png;base64," + base64.b64encode(v.pop("frame_png")).decode()
        return v

    def _foreign(self) -> bool:
        """Refuses (403) a request from another site: served on a loopback address, one whose
        Host names no loopback address (a rebound DNS name; any port, as an SSH tunnel's local
        one); any request whose Origin is not the Host it asks."""
        host = self.server.server_address[0]
        asked, origin = self.headers.get("Host") or "", self.headers.get("Origin")
        name = asked.rsplit(":", 1)[0] if not asked.endswith("]") else asked
        if (_loopback(host) and not _loopback(name.strip("[]"))
                or origin is not None and origin != f"http://{asked}"):
            self.close_connection = True  # (a POST's body is left unread)
            self._json(HTTPStatus.FORBIDDEN, {"error": "only a page of this server plays "
                                                       f"(open {self.server.url()})"})
            return True
        return False

    def do_GET(self):
        if self._foreign():
            return
        u = urlparse(self.path)
        if u.path == "/":
            self._send(200, PAGE.read_bytes(), "text/html; charset=utf-8")
        elif u.path == "/state":
            self._json(200, self._view())
        else:
            self._json(404, {"error": f"no page {u.path}"})

    def do_POST(self):
        if self._foreign():
            return
        u = urlparse(self.path)
        if self.headers.get_content_type() != "application/json":
            self.close_connection = True  # (its body is left unread)
            return self._json(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                              {"error": "send JSON (Content-Type: application/json)"})
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            self.close_connection = True
            return self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "request too large"})
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            return self._json(400, {"error": "the request is not a JSON object"})
        if u.path == "/claim":
            out = self._view()
            with self.server.owner_lock:
                self.server.owner = out["tab"] = secrets.token_hex(8)
            return self._json(200, out)
        if self.server.owner is None or body.get("tab") != self.server.owner:
            return self._json(409, {"error": "this game is being played in another tab (or "
                                             "the server restarted): reload this page to "
                                             "play here"})
        s = self.server.session
        try:
            if u.path == "/key":
                s.press(str(body.get("key", "")))
            elif u.path == "/new":
                seed = body.get("seed")
                if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
                    return self._json(400, {"error": "seed: a whole number from 0 to 2^31-1"})
                s.new_game(seed)
            else:
                return self._json(404, {"error": f"no action {u.path}"})
        except OSError as e:  # the disk refused a write: the step was not taken
            return self._json(500, {"error": f"recording failed: {e}"})
        except Exception as e:  # anything else: the page and the console say so, one line
            s.say(f"{u.path} failed: {type(e).__name__}: {e}")
            return self._json(500, {"error": f"{type(e).__name__}: {e}"})
        self._json(200, self._view())
