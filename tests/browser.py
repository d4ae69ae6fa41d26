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


class Browser:
    def __init__(self, url: str, width: int = 1500, height: int = 900):
        from websockets.sync.client import connect

        self.profile = tempfile.mkdtemp(prefix="chromium-")
        self.proc = subprocess.Popen(
            [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "--no-first-run", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ws = None
        deadline = time.time() + 60
        while time.time() < deadline and ws is None:
            line = self.proc.stderr.readline()
            if "DevTools listening on" in line:
                ws = line.split("listening on", 1)[1].strip()
        if ws is None:
            self.close()
            raise RuntimeError("chromium printed no DevTools address")
        port = ws.split(":")[2].split("/")[0]
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(p for p in pages if p["type"] == "page")
        self._conn = connect(page["webSocketDebuggerUrl"], max_size=2**26)
        self.ws = self._conn.__enter__()
        self.n = 0
        self.send("Page.enable")
        self.send("Page.navigate", url=url)

    def send(self, method: str, **params) -> dict:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, js: str):
        r = self.send("Runtime.evaluate", expression=js, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{js}: {r['exceptionDetails']}")
        return r["result"].get("value")

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

    def close(self) -> None:
        try:
            self._conn.__exit__(None, None, None)
        except Exception:
            pass
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


BIDI_KEYS = {"space": " ", "tab": "\ue004"}  # WebDriver's key values


class Firefox:
    """Firefox headless over WebDriver BiDi (its own, from Firefox 129; ESR 128 and later)."""

    def __init__(self, url: str, width: int = 1500, height: int = 900):
        from websockets.sync.client import connect

        self.profile = tempfile.mkdtemp(prefix="firefox-")
        self.proc = subprocess.Popen(
            [firefox(), "--headless",
             "--remote-debugging-port", "0", "--profile", self.profile, "--no-remote",
             f"--width={width}", f"--height={height}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ws = None
        deadline = time.time() + 90
        while time.time() < deadline and ws is None:
            line = self.proc.stderr.readline()
            if "WebDriver BiDi listening on" in line:
                ws = line.split("listening on", 1)[1].strip()
        if ws is None:
            self.close()
            raise RuntimeError("firefox printed no WebDriver BiDi address")
        self._conn = connect(ws + "/session", max_size=2**26)
        self.ws = self._conn.__enter__()
        self.n = 0
        self.send("session.new", capabilities={})
        self.context = self.send("browsingContext.getTree")["contexts"][0]["context"]
        self.send("browsingContext.navigate", context=self.context, url=url, wait="complete")

    def send(self, method, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.n:
                if msg.get("type") == "error":
                    raise RuntimeError(f"{method}: {msg.get('error')}: {msg.get('message')}")
                return msg.get("result", {})

    def eval(self, js):
        r = self.send("script.evaluate", expression=js, target={"context": self.context},
                      awaitPromise=True, resultOwnership="none")
        if r.get("type") == "exception":
            raise RuntimeError(f"{js}: {r['exceptionDetails'].get('text')}")
        return _value(r["result"])

    def wait(self, js, timeout=60.0):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                v = self.eval(js)
            except RuntimeError as e:
                v, last = None, e
            if v:
                return v
            time.sleep(0.1)
        raise TimeoutError(f"{js} (last error: {last})")

    def press(self, name):
        key = BIDI_KEYS.get(name, name)
        self.send("input.performActions", context=self.context, actions=[
            {"type": "key", "id": "keyboard", "actions": [{"type": "keyDown", "value": key},
                                                          {"type": "keyUp", "value": key}]}])

    def screenshot(self):
        return base64.b64decode(self.send("browsingContext.captureScreenshot",
                                          context=self.context)["data"])

    def close(self):
        try:
            self._conn.__exit__(None, None, None)
        except Exception:
            pass
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


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
