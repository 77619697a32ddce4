"""Reports for people: the partition as a self-contained HTML page (``render_html``).

Reads a Partition and its summary dict (partition/summary.py); imports no later stage.
"""
from tilefuse.report.html import render_html

__all__ = ["render_html"]
