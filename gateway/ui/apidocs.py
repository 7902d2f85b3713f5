"""``/docs`` and ``/redoc`` from assets the gateway serves itself (no CDN, no internet).

FastAPI's defaults load Swagger UI and ReDoc from a CDN; on a site without internet those
pages stay blank. The JavaScript and CSS ship inside the ``fastapi-offline`` wheel (the
swagger-ui-dist and redoc bundles, unmodified), so the gateway serves them from
``/static/apidocs/`` and nothing is fetched at build or run time.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/static/apidocs"
REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"


def assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"


def install(app: FastAPI) -> None:
    """Serve the API docs pages and their assets; the app must be built with docs_url=None."""
    title = app.title
    redoc_js = (assets_dir() / "redoc.standalone.js").read_bytes().replace(
        REDOC_CDN_LOGO, f"{ASSETS_URL}/favicon.png".encode())

    # Registered before the mount, so this route wins over the unmodified file.
    @app.get(f"{ASSETS_URL}/redoc.standalone.js", include_in_schema=False)
    def redoc_bundle() -> Response:
        return Response(redoc_js, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=3600"})

    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="apidocs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url, title=f"{title} - Swagger UI",
            oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=app.openapi_url, title=f"{title} - ReDoc",
                              redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{ASSETS_URL}/favicon.png", with_google_fonts=False)
