"""Reports: one self-contained HTML page per replay (``vramkit report``).

Nothing here needs the compiled extension.
"""
from __future__ import annotations

from .html import SECTION_TITLES, analyze_peak_state, build_report_html, format_bytes, render_report

__all__ = ["SECTION_TITLES", "analyze_peak_state", "build_report_html", "format_bytes", "render_report"]
