"""The built-in site served over real HTTP on 127.0.0.1, in a background thread.

One server serves many independent `SiteState`s at once: each episode registers its own state under a
random session id (`SiteServer.new_session`) and its browser context carries that id in a cookie, so
URLs stay clean (`/shop/product/3`) while episodes never see each other's state.
"""

from __future__ import annotations

import html
import http.cookies
import http.server
import secrets
import threading
import urllib.parse

from esopt.envs.web.site.pages import NotFound, Redirect, not_found, render
from esopt.envs.web.site.state import SiteState

SESSION_COOKIE = "esopt_sid"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: "_HTTPServer"
    protocol_version = "HTTP/1.0"

    def log_message(self, format, *args):  # noqa: A002 - silence the default stderr log
        pass

    def _send(self, code: int, body: str = "", location: str | None = None) -> None:
        data = body.encode()
        self.send_response(code)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _handle(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        cookies = http.cookies.SimpleCookie(self.headers.get("Cookie", ""))
        sid = cookies[SESSION_COOKIE].value if SESSION_COOKIE in cookies else ""
        state = self.server.site.sessions.get(sid)
        if state is None:
            self._send(403, "<html><head><title>No session</title></head><body>No session.</body></html>")
            return
        form: dict = {}
        if method == "POST":
            n = min(int(self.headers.get("Content-Length") or 0), 1 << 16)
            form = urllib.parse.parse_qs(self.rfile.read(n).decode("utf-8", "replace"), keep_blank_values=True)
        try:
            page = render(state, method, url.path, urllib.parse.parse_qs(url.query), form)
        except Redirect as r:
            self._send(303, "", r.location)
        except NotFound:
            self._send(404, not_found(state))
        except Exception as e:  # a bug in a page must not kill the server thread
            self._send(500, f"<html><head><title>Error</title></head><body>{html.escape(repr(e))}</body></html>")
        else:
            self._send(200, page)

    def do_GET(self) -> None:  # noqa: N802
        self._handle("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    site: "SiteServer"


class SiteServer:
    """The built-in site on 127.0.0.1:<free port>, serving one `SiteState` per session id."""

    def __init__(self) -> None:
        self.sessions: dict[str, SiteState] = {}
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.site = self
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="esopt-web-site", daemon=True
        )
        self._thread.start()

    def new_session(self, state: SiteState) -> str:
        sid = secrets.token_hex(12)
        self.sessions[sid] = state
        return sid

    def drop_session(self, sid: str) -> None:
        self.sessions.pop(sid, None)

    def close(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()
        self.sessions.clear()
