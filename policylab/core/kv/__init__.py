"""The KV cache as virtual memory (DESIGN §4), behind one manager (`KVManager`).

- `blocks`: the block pool (reference counts, free lists, LRU of cached blocks, the prefix index);
- `cost`: what a plan costs in blocks, asked before the pool commits anything;
- `hashes`, `radix`: the prefix index's keys and its radix-tree form;
- `cow`, `host`, `tiers`: the manager's strategies (copy-on-write, swap space, prefix tiers);
- `plane`: the data plane's K/V contents as the manager moves them;
- `manager`: `KVManager`, the one surface the engine, its extensions and the views use.
"""
from policylab.core.kv.blocks import blocks_for
from policylab.core.kv.hashes import chain_hashes, own_block_keys
from policylab.core.kv.manager import KVManager

__all__ = ["KVManager", "blocks_for", "chain_hashes", "own_block_keys"]
