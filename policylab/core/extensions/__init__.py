"""The engine's extensions, one feature each (`policylab.core.extension` is their protocol,
`policylab.core.features` their declarations): forks and beams, tool calls, closed-loop sessions,
speculative decoding. `extensions_for` builds the ones a run asks for, in the order the engine
calls them."""
from __future__ import annotations

from policylab.core.capabilities import Capability
from policylab.core.extensions.async_scheduling import AsyncScheduling
from policylab.core.extensions.client_timeout import ClientTimeout
from policylab.core.extensions.forks import Forks, uses_forks
from policylab.core.extensions.sessions import ClosedLoop
from policylab.core.extensions.speculation import Speculation
from policylab.core.extensions.tool_calls import ToolCalls, has_tool_calls


def extensions_for(trace: list, cfg, capabilities: frozenset, speculative=None, sessions=None,
                   prefix_block_tokens: int = 512, client_timeout=None) -> list:
    """The extensions an engine replaying `trace` with engine config `cfg` on a plane with
    `capabilities` runs: forks when a request asks for samples or beams, tool calls when one
    pauses for a tool, speculation wherever the plane verifies drafts (`speculative`: its
    config), the closed-loop client of a session plan (`sessions`), the lag of an engine that
    schedules ahead, where the plane models one, and clients that give up (`client_timeout` s). Forks come before tool
    calls: a step's forks spawn before its finished requests pause."""
    out = []
    if uses_forks(trace, cfg.parallel_samples, cfg.beam_width):
        out.append(Forks(cfg.parallel_samples, cfg.beam_width))
    if has_tool_calls(trace):
        out.append(ToolCalls(trace, cfg.tool_kv, cfg.host_kv_blocks))
    if Capability.DRAFTS in capabilities:
        out.append(Speculation(speculative))
    if sessions is not None:
        out.append(ClosedLoop(sessions, prefix_block_tokens))
    if Capability.SCHEDULES_AHEAD in capabilities:
        out.append(AsyncScheduling())
    if client_timeout is not None:
        out.append(ClientTimeout(client_timeout))
    return out
