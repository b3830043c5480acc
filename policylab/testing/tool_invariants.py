"""The invariants of requests that pause for tool calls, checked by `StepChecker` after every step.

A paused request holds exactly the KV its policy chose (kept: the same device blocks all the
pause long; freed: no device block and no computed token; offloaded: no device block and
its computed blocks on the host tier), is never scheduled or shown to a policy while paused,
and resumes, no earlier than its tool returns, with exactly its tokens plus the tool's.
"""
from __future__ import annotations

from policylab.core.request import Status
from policylab.core.extensions.tool_calls import tool_result_ids

EPS = 1e-9


class ToolCallChecks:
    def __init__(self, fail):
        self.fail = fail
        self.paused: dict = {}       # req_id -> (choice, device blocks, tokens, computed, return time)
        self.kept_waiting: set = set()   # resumed with the blocks they kept, not running yet

    def views_hide_paused(self, view) -> None:
        """No paused request is among the requests a policy sees."""
        shown = [rid for rid, v in view.by_id.items() if v.status == Status.PAUSED.value]
        if shown:
            self.fail("tool_calls", f"paused requests {shown} are shown to the policy")

    def not_scheduled(self, batch, shown: dict) -> None:
        """Every request of the batch was shown to the policy, waiting or running (not paused)."""
        ran = [rid for rid in batch.req_ids if rid not in shown]
        if ran:
            self.fail("tool_calls", f"paused requests {ran} were scheduled while their tool runs")

    def paused_now(self, engine, r) -> None:
        """RUNNING -> PAUSED: its KV is what the choice says, its tokens are recorded."""
        rid = r.req_id
        entry = engine.extension("tool_calls").paused.get(rid)
        if entry is None:
            self.fail("tool_calls", f"request {rid} is paused but the engine has no tool call for it")
        _, choice, computed = entry
        mode = engine.cfg.tool_kv
        if mode != "policy" and choice != mode and not (mode == "offload" and choice == "free"):
            self.fail("tool_calls", f"request {rid}: engine.tool_kv={mode} but its KV was {choice}")
        self._holds_its_choice(engine, r, choice, computed)
        tokens = tuple(int(x) for x in r.token_ids(0, r.num_tokens))     # (the reference on resume)
        k = engine.extension("tool_calls").reached[rid] - 1
        back = engine.clock.now + engine.trace[rid].tool_calls[k].duration_s
        self.paused[rid] = (choice, tuple(r.block_table), tokens, computed, back, k)
        self.kept_waiting.discard(rid)

    def _holds_its_choice(self, engine, r, choice: str, computed: int) -> None:
        rid, bs, host = r.req_id, engine.kv.block_size, engine.kv.host
        blocks = -(-computed // bs)
        if choice == "keep":
            ok = len(r.block_table) >= blocks and r.num_computed_tokens == computed and \
                all(engine.kv.refs[b] > 0 for b in r.block_table) and not host.holds(rid)
        elif choice == "free":
            ok = not r.block_table and r.num_computed_tokens == 0 and not host.holds(rid) and not r.swapped_blocks
        else:
            ok = not r.block_table and r.num_computed_tokens == computed and host.holds(rid) \
                and host.blocks_of(rid) == r.swapped_blocks == blocks
        if not ok:
            self.fail("tool_calls", f"paused request {rid} ({choice}): {len(r.block_table)} device blocks, "
                      f"{host.blocks_of(rid)} host blocks, {r.num_computed_tokens} computed of {computed}")

    def still_paused(self, engine, r) -> None:
        """Every step of the pause: the same KV as when it paused (kept: the very same blocks)."""
        choice, table, _, computed, _, k = self.paused[r.req_id]
        if engine.extension("tool_calls").reached[r.req_id] - 1 != k:      # resumed, ran and paused again in one step
            self.resumed(engine, r, check_kv=False)
            self.paused_now(engine, r)
            return True
        if tuple(r.block_table) != table:
            self.fail("tool_calls", f"paused request {r.req_id}: its device blocks changed during the pause")
        self._holds_its_choice(engine, r, choice, computed)
        return False

    def resumed(self, engine, r, check_kv: bool = True) -> None:
        """PAUSED -> anything else: not before its tool returned, with its tokens + the tool's."""
        rid = r.req_id
        choice, table, tokens, _, back, k = self.paused.pop(rid)
        call = engine.trace[rid].tool_calls[k]
        if engine.clock.now < back - EPS:
            self.fail("tool_calls", f"request {rid} resumed before its tool returned (at {back})")
        want = tokens + tuple(int(x) for x in tool_result_ids(engine.seed, rid, k, call.result_tokens,
                                                              engine.dataplane.vocab_size))
        have = tuple(int(x) for x in r.token_ids(0, min(r.num_tokens, len(want))))
        if have != want:
            self.fail("tool_calls", f"request {rid} resumed with other tokens than its own and the tool's")
        released = rid in engine.extension("tool_calls")._to_recompute   # (release_kept: the replay could not go on)
        if check_kv and choice == "keep" and not released and r.block_table[:len(table)] != list(table):
            self.fail("tool_calls", f"request {rid} resumed without the blocks it kept")
        if choice == "keep" and r.status is Status.WAITING:
            self.kept_waiting.add(rid)

    def holding_memory(self) -> bool:
        """Paused requests keep device blocks: an empty plan may be the policy's choice to wait for
        them (the engine idles until a tool returns)."""
        return any(entry[1] for entry in self.paused.values()) or bool(self.kept_waiting)

    def kept_released(self, engine) -> list:
        """Kept waiting requests whose KV the engine freed (`ToolCalls.release_kept`)."""
        reqs = engine.requests
        gone = [rid for rid in self.kept_waiting if reqs[rid].status is Status.WAITING and not reqs[rid].block_table]
        self.kept_waiting.difference_update(gone)
        return gone

    def held_by_paused(self, engine) -> list:
        """Device blocks held by requests out of the running list: paused ones that kept theirs,
        and kept ones waiting again (those running again leave `kept_waiting`)."""
        reqs = engine.requests
        self.kept_waiting = {rid for rid in self.kept_waiting if reqs[rid].status is Status.WAITING}
        return [b for rid in (*self.paused, *self.kept_waiting) for b in reqs[rid].block_table]

    def host_owners(self, engine) -> dict:
        return {rid: engine.requests[rid].swapped_blocks for rid in self.paused
                if engine.requests[rid].swapped_blocks}
