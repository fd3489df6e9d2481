"""The built site shows every image its pages show: a missing one fails the build.

Sphinx checks and copies the images of Markdown and of the ``image``
directive, but not those of a page's raw HTML (``<img src=…>``): such an
image is missing from the built site, and no warning says so. When the
HTML build has finished, every ``<img src>`` of its pages that is a
relative path must name a file of the site.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

IMAGE_SOURCE = re.compile(r"<img\b[^>]*?\bsrc=\"([^\"]+)\"", re.IGNORECASE)


def missing_images(site: Path) -> list[str]:
    """``page: src`` for each image a built page shows that is not in the site."""
    missing = []
    for page in sorted(site.rglob("*.html")):
        for source in IMAGE_SOURCE.findall(page.read_text(errors="replace")):
            parts = urlsplit(source)
            if parts.scheme or parts.netloc or not parts.path:
                continue  # another site's image, or data: inline
            if not (page.parent / unquote(parts.path)).is_file():
                missing.append(f"{page.relative_to(site)}: {source}")
    return missing


def check_images(app: Any, exception: Exception | None) -> None:
    from sphinx.errors import ExtensionError

    if exception is not None or app.builder.format != "html":
        return
    missing = missing_images(Path(app.outdir))
    if missing:
        raise ExtensionError(
            "pages show images the built site does not have (a raw HTML <img> is not "
            "copied: use Markdown's ![…](…) or the {image} directive): " + "; ".join(missing)
        )


def setup(app: Any) -> dict[str, Any]:
    app.connect("build-finished", check_images)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
