"""The playground: a static page (gateway/playground/) served at /playground/, no key (no data in its files:
every figure it shows comes from /v1 with the key the user types)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from hf2triton.gateway.errors import ApiError

PLAYGROUND = Path(__file__).parent.parent / "playground"
PLAYGROUND_FILES = {
    "index.html": (PLAYGROUND / "index.html", "text/html; charset=utf-8"),
    "app.js": (PLAYGROUND / "app.js", "text/javascript; charset=utf-8"),
    "tasks.js": (PLAYGROUND / "tasks.js", "text/javascript; charset=utf-8"),
    "audio.js": (PLAYGROUND / "audio.js", "text/javascript; charset=utf-8"),
    "style.css": (PLAYGROUND / "style.css", "text/css; charset=utf-8"),
    "icon.svg": (PLAYGROUND / "icon.svg", "image/svg+xml"),
}
# The page loads nothing but its own files and talks only to this gateway; what a model says is never markup. img-src
# blob: shows the image the user picked (an object URL of their own file) next to its labels, media-src blob: plays
# the audio picked or recorded.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' blob:; "
    "media-src blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


PAGES = {name: (path.read_bytes(), media_type) for name, (path, media_type) in PLAYGROUND_FILES.items()}  # read once
router = APIRouter()


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)  # HEAD: link checkers and uptime probes
@router.api_route("/playground", methods=["GET", "HEAD"], include_in_schema=False)
async def to_playground():
    return RedirectResponse("/playground/", status_code=307)


@router.api_route("/playground/{name:path}", methods=["GET", "HEAD"], include_in_schema=False)
async def playground(name: str):
    """The playground's static files (no data in them: every figure comes from /v1 with the key)."""
    found = PAGES.get(name or "index.html")
    if found is None:
        raise ApiError(404, f"no playground file {name[:100]!r}", code="not_found")
    content, media_type = found
    return Response(content, media_type=media_type, headers=PAGE_HEADERS)
