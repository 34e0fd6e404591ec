"""Pictures of one step of a log: ``render`` for Python and notebooks, ``write_picture`` for
``hooktrace render`` (``drawing.py``); the DOT text (``dot.py``), the table of ``hooktrace show``
(``text.py``, with its ``--edges``), a zoomed call's operations (``ops.py``).

    >>> picture = hooktrace.show.render.render("hooktrace.jsonl")   # Jupyter shows it inline
    >>> print(picture.source)                                  # the DOT text
"""

from hooktrace.show.render.drawing import (
    FORMATS,
    Picture,
    RenderOptions,
    Written,
    picture,
    render,
    write_picture,
)

__all__ = ["FORMATS", "Picture", "RenderOptions", "Written", "picture", "render", "write_picture"]
