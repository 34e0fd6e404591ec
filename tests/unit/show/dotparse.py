"""A small DOT reader for the unit tests: the graph, its nodes, edges and nested clusters, read
from the text ``render`` returns (no Graphviz program, no pydot). It reads the DOT the graphviz
package writes: quoted, HTML (``<...>``) and bare ids; node, edge, attribute statements and
subgraphs. Anything else is a ``DotSyntaxError``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(r"""\s*(?:(->|--|[{}\[\]=;,])|("(?:[^"\\]|\\.)*")|([A-Za-z0-9_.\-]+)|(<))""",
                    re.DOTALL)


_PUNCTUATION = {"->", "--", "{", "}", "[", "]", "=", ";", ","}


class DotSyntaxError(ValueError):
    """The text is not DOT as this reader reads it."""


def tokens(text: str) -> list[str]:
    """The tokens of ``text``: punctuation, ids as written (quotes and angle brackets kept)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i:].strip() == "":
            break
        m = _TOKEN.match(text, i)
        if m is None:
            raise DotSyntaxError(f"unexpected text at {i}: {text[i:i + 30]!r}")
        if m.group(4):  # an HTML string: up to its matching '>'
            start, depth, j = m.start(4), 0, m.start(4)
            while j < len(text):
                depth += {"<": 1, ">": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
            if depth:
                raise DotSyntaxError(f"unclosed HTML string at {start}")
            out.append(text[start:j])
            i = j
        else:
            out.append(m.group(1) or m.group(2) or m.group(3))
            i = m.end()
    return out


def value(token: str) -> str:
    """An id's value: quotes removed and ``\\"`` unescaped; an HTML string keeps its brackets."""
    if token.startswith('"'):
        return token[1:-1].replace('\\"', '"')
    return token


@dataclass
class Cluster:
    name: str
    parent: str | None  # the enclosing cluster's name; None: the graph itself
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass
class Edge:
    tail: str
    head: str
    attrs: dict[str, str]


@dataclass
class Dot:
    name: str
    directed: bool
    attrs: dict[str, str] = field(default_factory=dict)  # the graph's own
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    where: dict[str, str | None] = field(default_factory=dict)  # node -> its cluster (None: top)
    clusters: dict[str, Cluster] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)

    def path(self, node: str) -> list[str]:
        """The clusters around ``node``, outermost first."""
        found: list[str] = []
        inside = self.where[node]
        while inside is not None:
            found.insert(0, inside)
            inside = self.clusters[inside].parent
        return found


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = tokens(text)
        self.i = 0

    def peek(self, ahead: int = 0) -> str | None:
        j = self.i + ahead
        return self.toks[j] if j < len(self.toks) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise DotSyntaxError(f"expected {expected or 'a token'} at token {self.i}, got {tok!r}")
        self.i += 1
        return tok

    def ident(self) -> str:
        """An id's value; punctuation is not one."""
        tok = self.take()
        if tok in _PUNCTUATION:
            raise DotSyntaxError(f"expected an id at token {self.i - 1}, got {tok!r}")
        return value(tok)

    def attr_list(self) -> dict[str, str]:
        attrs: dict[str, str] = {}
        while self.peek() == "[":
            self.take("[")
            while self.peek() != "]":
                key = self.ident()
                self.take("=")
                attrs[key] = self.ident()
                if self.peek() in (",", ";"):
                    self.take()
            self.take("]")
        return attrs

    def graph(self) -> Dot:
        kind = self.take()
        if kind not in ("digraph", "graph"):
            raise DotSyntaxError(f"not a graph: starts with {kind!r}")
        dot = Dot(self.ident(), kind == "digraph")
        self.take("{")
        self.stmts(dot, None)
        self.take("}")
        if self.peek() is not None:
            raise DotSyntaxError(f"text after the graph: {self.peek()!r}")
        return dot

    def stmts(self, dot: Dot, cluster: str | None) -> None:
        own = dot.attrs if cluster is None else dot.clusters[cluster].attrs
        while self.peek() not in ("}", None):
            tok = self.take()
            if tok in _PUNCTUATION:
                raise DotSyntaxError(f"unexpected {tok!r} at token {self.i - 1}")
            if tok in ("graph", "node", "edge") and self.peek() == "[":
                attrs = self.attr_list()
                if tok == "graph":
                    own.update(attrs)
            elif tok == "subgraph":
                name = self.ident()
                dot.clusters[name] = Cluster(name, cluster)
                self.take("{")
                self.stmts(dot, name)
                self.take("}")
            elif self.peek() == "=":
                self.take("=")
                own[value(tok)] = self.ident()
            elif self.peek() in ("->", "--"):
                op = self.take()
                if (op == "->") != dot.directed:
                    raise DotSyntaxError(f"edge {op} in a {'di' * dot.directed}graph")
                head = self.ident()
                dot.edges.append(Edge(value(tok), head, self.attr_list()))
                for end in (value(tok), head):
                    dot.nodes.setdefault(end, {})
                    dot.where.setdefault(end, cluster)
            else:
                name = value(tok)
                if dot.nodes.get(name):
                    raise DotSyntaxError(f"node {name!r} written twice")
                dot.nodes[name] = self.attr_list()
                dot.where[name] = cluster
            if self.peek() == ";":
                self.take(";")


def parse(text: str) -> Dot:
    """The graph in ``text``; DotSyntaxError where it is not DOT."""
    return _Parser(text).graph()
