"""The auditor console: ``GET /console/``, a small single-page app served by the gateway itself.

Rules:

- Plain HTML, CSS and ES modules in ``gateway/side/console/static`` (package data): no build step,
  no Node.js, no CDN, no external font; every asset is read once at start-up and served from
  memory. Only the files in that directory exist; anything else under ``/console/`` is 404.
- Every response carries a strict Content-Security-Policy (scripts and styles only from the
  gateway itself, no inline script, no ``eval``, no frames, connections only to the gateway),
  ``X-Frame-Options: DENY``, ``Referrer-Policy: no-referrer``, ``X-Content-Type-Options:
  nosniff`` and ``Cache-Control: no-cache`` (assets revalidate: an upgrade is seen at once).
- The page calls only the auditor and admin APIs, with the key the user pasted (kept in
  ``sessionStorage``, never a cookie or the URL), so it has exactly their authorisation and
  tenant scope. Decrypted text is put into the page as text (``textContent``), never as HTML.
- ``CONSOLE_ENABLED=false`` removes the routes; nothing here touches the completion path.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from gateway.errors import NotFound

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def assets() -> dict[str, tuple[bytes, str]]:
    """``name -> (bytes, content type)`` of every file the console ships."""
    found = {}
    for entry in resources.files(__package__).joinpath("static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _TYPES:
            found[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return found


def add_routes(app: FastAPI) -> None:
    files = assets()

    async def index(request: Request) -> Response:
        return _asset(files, "index.html")

    async def asset(request: Request) -> Response:
        return _asset(files, request.path_params["name"])

    async def bare(request: Request) -> Response:
        return RedirectResponse("/console/", status_code=308, headers=HEADERS)

    app.add_api_route("/console", bare, methods=["GET"], response_model=None,
                      include_in_schema=False)  # fmt: skip
    app.add_api_route("/console/", index, methods=["GET"], response_model=None,
                      include_in_schema=False)  # fmt: skip
    app.add_api_route("/console/{name}", asset, methods=["GET"], response_model=None,
                      include_in_schema=False)  # fmt: skip


def _asset(files: dict[str, tuple[bytes, str]], name: str) -> Response:
    found = files.get(name)
    if found is None:
        raise NotFound(f"No console file '{name[:64]}'.")
    body, media_type = found
    return Response(body, media_type=media_type, headers=HEADERS)
