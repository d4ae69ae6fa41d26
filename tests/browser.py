"""Headless browsers driven over their own protocols (the `websockets` test extra): Chromium
(the system package `chromium`) over DevTools, Firefox (`firefox-esr`) over WebDriver BiDi, no
driver binaries. Both: open a page, evaluate JavaScript, press keys, take a screenshot."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request

# key name -> (KeyboardEvent.key, .code, keyCode)
SPECIAL = {"space": (" ", "Space", 32), "tab": ("Tab", "Tab", 9), ",": (",", "Comma", 188),
           ".": (".", "Period", 190)}


BIDI_KEYS = {"space": " ", "tab": "\ue004"}  # WebDriver's key values


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def firefox() -> str | None:
    return shutil.which("firefox-esr") or shutil.which("firefox")


BROWSERS = {"chromium": chromium, "firefox": firefox}


def open_page(kind: str, url: str, **kw):
    return (Browser if kind == "chromium" else Firefox)(url, **kw)


class _Driven:
    """A browser process and its protocol socket: launch, request / reply, wait, close."""

    def _launch(self, argv: list[str], marker: str, timeout: float) -> str:
        """Starts argv; returns the websocket address printed after `marker` on stderr."""
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if marker in line:
                return line.split("listening on", 1)[1].strip()
        self.close()
        raise RuntimeError(f"{argv[0]} printed no {marker!r}")

    def _connect(self, ws: str) -> None:
        from websockets.sync.client import connect

        self._conn = connect(ws, max_size=2**26)
        self.ws = self._conn.__enter__()
        self.n = 0

    def send(self, method: str, **params) -> dict:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}: {msg.get('message', '')}")
                return msg.get("result", {})

    def wait(self, js: str, timeout: float = 60.0):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:  # the page may not have loaded yet (its script's names undefined)
                v = self.eval(js)
            except RuntimeError as e:
                v, last = None, e
            if v:
                return v
            time.sleep(0.1)
        raise TimeoutError(f"{js} (last error: {last})")

    def close(self) -> None:
        try:
            self._conn.__exit__(None, None, None)
        except Exception:
            pass
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


class Browser(_Driven):
    """Chromium over its DevTools protocol."""

    def __init__(self, url: str, width: int = 1500, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        ws = self._launch([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
                           "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
                           f"--window-size={width},{height}", "--no-first-run", "about:blank"],
                          "DevTools listening on", 60)
        port = ws.split(":")[2].split("/")[0]
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        self._connect(next(p for p in pages if p["type"] == "page")["webSocketDebuggerUrl"])
        self.send("Page.enable")
        self.send("Page.navigate", url=url)

    def eval(self, js: str):
        r = self.send("Runtime.evaluate", expression=js, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{js}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def press(self, name: str) -> None:
        if name in SPECIAL:
            key, code, kc = SPECIAL[name]
        else:
            key, code, kc = (name, f"Key{name.upper()}" if name.isalpha() else f"Digit{name}",
                             ord(name.upper()))
        text = key if len(key) == 1 else ""
        self.send("Input.dispatchKeyEvent", type="keyDown", key=key, code=code, text=text,
                  windowsVirtualKeyCode=kc, nativeVirtualKeyCode=kc)
        self.send("Input.dispatchKeyEvent", type="keyUp", key=key, code=code,
                  windowsVirtualKeyCode=kc, nativeVirtualKeyCode=kc)

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])


class Firefox(_Driven):
    """Firefox headless over WebDriver BiDi (its own, from Firefox 129; ESR 128 and later)."""

    def __init__(self, url: str, width: int = 1500, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="firefox-")
        ws = self._launch([firefox(), "--headless", "--remote-debugging-port", "0", "--profile",
                           self.profile, "--no-remote", f"--width={width}",
                           f"--height={height}"], "WebDriver BiDi listening on", 90)
        self._connect(ws + "/session")
        self.send("session.new", capabilities={})
        self.context = self.send("browsingContext.getTree")["contexts"][0]["context"]
        self.send("browsingContext.navigate", context=self.context, url=url, wait="complete")

    def eval(self, js):
        r = self.send("script.evaluate", expression=js, target={"context": self.context},
                      awaitPromise=True, resultOwnership="none")
        if r.get("type") == "exception":
            raise RuntimeError(f"{js}: {r['exceptionDetails'].get('text')}")
        return _value(r["result"])

    def press(self, name):
        key = BIDI_KEYS.get(name, name)
        self.send("input.performActions", context=self.context, actions=[
            {"type": "key", "id": "keyboard", "actions": [{"type": "keyDown", "value": key},
                                                          {"type": "keyUp", "value": key}]}])

    def screenshot(self):
        return base64.b64decode(self.send("browsingContext.captureScreenshot",
                                          context=self.context)["data"])


def _value(r):
    t = r.get("type")
    if t in ("number", "string", "boolean"):
        return r["value"]
    if t in ("null", "undefined"):
        return None
    if t == "array":
        return [_value(x) for x in r["value"]]
    if t == "object":
        return {k: _value(v) for k, v in r["value"]}
    return r.get("value")
