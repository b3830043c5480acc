"""A radix tree over cached KV blocks (SGLang's RadixAttention), the `engine.prefix_cache=radix` index.

Each node is one cached block; its edge from the parent is labelled by the block's chained hash
(which fingerprints the block's tokens and everything before them), so a prompt's hits are the
path walked from the root while its blocks' labels match: block-granular matching, as SGLang's
tree with a page size equal to the block size (block_size=1 matches token by token).

What the tree adds over the flat hash map is its shape: the block pool evicts *leaves* first
(least recently freed leaf), so a shared prefix is never evicted while a cached continuation of
it is still reachable. When a block's parent is evicted anyway (no free leaf is left), its
children are kept aside under the parent's label and re-attached if that label is cached again,
so the tree answers exactly what the chained-hash map answers for the same cache contents.
"""
from __future__ import annotations


class _Node:
    __slots__ = ("block", "label", "parent_label", "parent", "children")

    def __init__(self, block: int, label, parent_label, parent):
        self.block, self.label, self.parent_label, self.parent = block, label, parent_label, parent
        self.children: dict = {}


class RadixTree:
    def __init__(self):
        self.root = _Node(-1, None, None, None)
        self.nodes: dict = {}            # label -> node (attached or not)
        self._orphans: dict = {}         # parent label -> {label: node} whose parent is not cached

    def __len__(self) -> int:
        return len(self.nodes)

    def lookup(self, labels, max_blocks: int) -> tuple:
        """Blocks along the longest path from the root matching `labels` (at most max_blocks)."""
        node, hit = self.root, []
        for label in labels[:max_blocks]:
            node = node.children.get(label)
            if node is None:
                break
            hit.append(node.block)
        return tuple(hit)

    def insert(self, label, parent_label, block: int) -> None:
        """Cache `block` under `label`, the child of the block labelled `parent_label` (None: a
        prompt's first block); children of an earlier `label` that were set aside join it."""
        parent = self.root if parent_label is None else self.nodes.get(parent_label)
        node = _Node(block, label, parent_label, parent)
        self.nodes[label] = node
        if parent is None:
            self._orphans.setdefault(parent_label, {})[label] = node
        else:
            parent.children[label] = node
        for child in self._orphans.pop(label, {}).values():
            child.parent = node
            node.children[child.label] = child

    def remove(self, label) -> None:
        """Evict the block labelled `label`; its children are set aside under its label."""
        node = self.nodes.pop(label)
        if node.parent is None:
            siblings = self._orphans[node.parent_label]
            del siblings[label]
            if not siblings:
                del self._orphans[node.parent_label]
        else:
            del node.parent.children[label]
        if node.children:
            for child in node.children.values():
                child.parent = None
            self._orphans.setdefault(label, {}).update(node.children)

    def is_leaf(self, label) -> bool:
        return not self.nodes[label].children

    def check(self, cached: dict) -> None:
        """The tree holds exactly the hash map's (label -> block) entries, linked consistently."""
        assert {k: n.block for k, n in self.nodes.items()} == dict(cached), "radix tree out of sync with the cache"
        for node in self.nodes.values():
            if node.parent is not None:
                assert node.parent.children.get(node.label) is node, "radix child not linked"
                assert node.parent is self.root or node.parent.label == node.parent_label, "radix parent label"
            else:
                assert node.parent_label not in self.nodes, "a set-aside node's parent is cached"
