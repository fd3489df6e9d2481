"""Sphinx configuration of the jupyter_agentruns documentation (MyST Markdown, PyData theme)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))  # the reference generators, the images check
sys.path.insert(0, str(HERE.parent))  # the package, from the clone, when not installed

project = "jupyter_agentruns"
author = "jupyter_agentruns contributors"
copyright = "jupyter_agentruns contributors"

extensions = ["myst_parser", "agentruns_reference", "agentruns_api", "agentruns_images"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# The generated reference is included into hand-written pages, never read on its own.
exclude_patterns = ["_build", "reference/generated", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
# Checked links: a link to a page or an anchor that does not exist fails the build (-W).
nitpicky = True
# Help texts quote code with plain quotes: keep them as written.
smartquotes = False
suppress_warnings = []

html_theme = "pydata_sphinx_theme"
html_title = "jupyter_agentruns"
html_static_path = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
