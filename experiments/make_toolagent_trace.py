"""Write traces/toolagent.jsonl: a small agent trace whose requests pause for tool calls.

Run from the repository root: python experiments/make_toolagent_trace.py (byte-identical output).
"""
import json, numpy as np
from policylab.traces.tool_calls import add_tool_calls, record_of_calls
rng = np.random.default_rng(7)
rows, t = [], 0.0
for i in range(40):
    t += float(rng.exponential(0.25))
    p = int(rng.integers(64, 512)); o = int(rng.integers(24, 160))
    rows.append({"arrival_time": round(t, 4), "prompt_tokens": p, "output_tokens": o, "client": f"agent-{i % 4}"})
calls = add_tool_calls([r["output_tokens"] for r in rows], {"calls": 2, "duration_s": 1.0, "result_tokens": 96, "fraction": 0.75}, np.random.default_rng(8))
with open("traces/toolagent.jsonl", "w") as f:
    for r, c in zip(rows, calls):
        if c:
            r["tool_calls"] = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()} for d in record_of_calls(c)]
        f.write(json.dumps(r) + "\n")
