"""The DOT reader the render tests use (``dotparse``) reads what it must and rejects what is not
DOT, so that "parses as a digraph" in those tests can fail."""

from __future__ import annotations

import pytest

from unit.show.dotparse import DotSyntaxError, parse, tokens

GOOD = """digraph g {
\tgraph [label=<<B>a</B> · b>]
\tnode [shape=box]
\tsubgraph "cluster_x" {
\t\tlabel="x \\"quoted\\"" color=red
\t\tsubgraph "cluster_x.y" {
\t\t\t"n#1" [label=<<B>n</B><BR/>1>]
\t\t}
\t}
\tm [shape=point]
\t"n#1" -> m [label="1 · |g| 2.0e0" style=dashed]
}
"""


def test_reads_nodes_edges_and_nested_clusters() -> None:
    dot = parse(GOOD)
    assert (dot.name, dot.directed) == ("g", True)
    assert dot.attrs == {"label": "<<B>a</B> · b>"}
    assert dot.nodes == {"n#1": {"label": "<<B>n</B><BR/>1>"}, "m": {"shape": "point"}}
    assert dot.path("n#1") == ["cluster_x", "cluster_x.y"] and dot.path("m") == []
    assert dot.clusters["cluster_x"].attrs == {"label": 'x "quoted"', "color": "red"}
    assert [(e.tail, e.head, e.attrs["style"]) for e in dot.edges] == [("n#1", "m", "dashed")]


def test_html_strings_are_one_token() -> None:
    assert tokens('a [label=<<TABLE><TR><TD>x &gt; y</TD></TR></TABLE>>]') == [
        "a", "[", "label", "=", "<<TABLE><TR><TD>x &gt; y</TD></TR></TABLE>>", "]"]


@pytest.mark.parametrize("text", [
    GOOD[:-3],  # cut off: a brace short
    GOOD.replace("digraph", "strict"),
    GOOD.replace("->", "--"),  # an undirected edge in a digraph
    GOOD + "x",
    GOOD.replace('"n#1" -> m', '"n#1" ->'),
    GOOD.replace("<<B>n</B><BR/>1>", "<<B>n</B><BR/>1"),  # an HTML string not closed
    GOOD.replace("\tm [shape=point]", '\t"n#1" [shape=point]'),  # a node written twice
    "digraph g { a [label=@] }",
])
def test_rejects_what_is_not_dot(text: str) -> None:
    with pytest.raises(DotSyntaxError):
        parse(text)
