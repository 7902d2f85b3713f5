"""Security headers on every /ui response (docs/ui.md, "Security"; #27, finding 10).

Every /ui asset is the gateway's own (templates, /ui/static): no inline script, no inline
style, nothing from another origin. The policy says exactly that, so an injected tag that
escaped the templates' escaping still could not run, load or send anything, and no other
site may frame the dashboard (clickjacking the cancel button).
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    "Referrer-Policy": "no-referrer",  # job ids in /ui URLs stay here
    "X-Content-Type-Options": "nosniff",
}


class UiHeadersMiddleware:
    def __init__(self, app, *, prefix: str = "/ui"):
        self.app, self.prefix = app, prefix

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == self.prefix or path.startswith(self.prefix + "/")):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
