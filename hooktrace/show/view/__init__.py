"""``hooktrace view``: a whole run on one self-contained HTML page (call graphs by step, the
gradient-flow heatmap, check's findings), or the heatmap alone as svg/png (``write.py``); what
one log holds for it (``data.py``), the graphs (``graphs.py``), the heatmap (``heatmap.py``),
the page's HTML (``page.py``).

    >>> hooktrace.show.view.heatmap_picture("log.jsonl")   # Jupyter shows the heatmap inline

Reading the log never imports torch; the pictures need Graphviz ``dot``.
"""

from hooktrace.show.view.write import (
    FORMATS,
    HeatmapPicture,
    Viewed,
    heatmap_picture,
    view_page,
    write_view,
)

__all__ = ["FORMATS", "HeatmapPicture", "Viewed", "heatmap_picture", "view_page", "write_view"]
