"""Graph algorithms over plain `node -> successors` mappings (nodes are strings)."""

from __future__ import annotations

from typing import Iterable, Mapping


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, every node's in one, in the order Tarjan
    closes them; iterative (a graph of thousands of nodes must not hit the recursion limit).
    A successor that is not a key of graph is a node with no successors of its own."""
    successors = {node: list(nexts) for node, nexts in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    parts: list[list[str]] = []
    for root in successors:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, edge = work.pop()
            if edge == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            edges = successors.get(node, [])
            if edge < len(edges):
                work.append((node, edge + 1))
                nxt = edges[edge]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                parts.append(part)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return parts
