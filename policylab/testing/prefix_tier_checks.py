"""The prefix cache's tiers (device, host, disk) under the invariant harness, after every step and
at drain: what `policylab.core.kv.tiers` promises, checked from outside it."""
from __future__ import annotations


def check_prefix_tiers(checker, engine) -> None:
    """Conservation across tiers: each tier's used + free = its size, and the cached blocks of the
    three tiers are distinct (device + host + disk = the distinct blocks cached anywhere); nothing
    is left pinned between steps (so nothing leaks at drain); a block promoted by this step is the
    device's cache entry for its hash, at the position of that hash in a running request's table."""
    kv, tiers = engine.kv, engine.kv.tiers
    device = set(kv.cache_map)
    sizes = {}
    distinct = {}
    for store in (tiers.host, tiers.disk):
        held = store.hashes()
        sizes[store.name], distinct[store.name] = len(held), set(held)
        if len(held) + store.num_free != store.capacity or len(distinct[store.name]) != len(held):
            checker.fail("kv_conservation", f"prefix {store.name} tier: used={len(held)} free={store.num_free} "
                         f"total={store.capacity}")
    host, disk = distinct[tiers.host.name], distinct[tiers.disk.name]
    union = device | host | disk
    if len(union) != len(device) + sizes["host"] + sizes["disk"]:
        checker.fail("kv_conservation", f"prefix tiers: device {len(device)} + host {sizes['host']} + disk "
                     f"{sizes['disk']} cached blocks, {len(union)} distinct: a block is cached on two tiers")
    if tiers._pending:
        checker.fail("no_leak", f"prefix tiers: {len(tiers._pending)} promotions left pending after a step")
    if not tiers.promoted:
        return
    where = {}
    for r in engine.running:
        for i, b in enumerate(r.block_table[:len(r.block_hashes)]):
            where[b] = r.block_hashes[i]
    for h, b in tiers.promoted:
        if kv.cache_map.get(h) != b or where.get(b, h) != h:
            checker.fail("promotion", f"block {b} promoted for hash {h:#x} is cached as "
                         f"{kv.cache_map.get(h)} and sits where hash {where.get(b)} belongs")
    tiers.promoted.clear()               # (checked once: a later step may evict them again)
