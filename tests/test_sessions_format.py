"""Session traces (policylab.traces.sessions): the format read and written, every bad input a
clear error naming file, line and field; sessions recovered from BurstGPT's `Session ID` and from
Mooncake's chained hash ids; the seeded generator; the transforms that apply to sessions."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from policylab.apps.trace_cli import main as trace_main
from policylab.traces import TraceConfig, TraceError, load_trace
from policylab.traces.formats import detect_format
from policylab.traces.session_generate import SessionSpec, generate_sessions
from policylab.traces.session_sources import read_burstgpt_sessions, read_mooncake_sessions
from policylab.traces.sessions import plan_of, read_sessions, write_sessions

pytestmark = pytest.mark.timeout(120)


def write(tmp_path, records, name="s.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


GOOD = [{"session": "b", "turn": 1, "think_time": 2.5, "new_tokens": 10, "output_tokens": 4},
        {"session": "a", "turn": 0, "arrival_time": 3.0, "new_tokens": 50, "output_tokens": 7, "client": "u1"},
        {"session": "b", "turn": 0, "arrival_time": 1.0, "new_tokens": 30, "output_tokens": 5,
         "prefix_hashes": [1, 2]}]


def test_a_session_trace_reads_in_any_line_order_and_round_trips(tmp_path):
    path = write(tmp_path, GOOD)
    assert detect_format(path, "s.jsonl") == "sessions"
    sessions = read_sessions(path, "s.jsonl")
    assert [s.id for s in sessions] == ["b", "a"] and [s.start for s in sessions] == [1.0, 3.0]
    b = sessions[0]
    assert [(t.new_tokens, t.output_tokens, t.think_time) for t in b.turns] == [(30, 5, 0.0), (10, 4, 2.5)]
    assert b.prefix_hashes == (1, 2) and sessions[1].turns[0].client == "u1"
    again = tmp_path / "again.jsonl"
    assert write_sessions(again, sessions) == 3
    assert read_sessions(again, "again.jsonl") == sessions
    plan = plan_of(sessions)
    assert [t.prompt_tokens for t in plan.trace] == [30, 30 + 5 + 10, 50]    # the conversation so far
    assert [t.client for t in plan.trace] == ["b", "b", "u1"] and plan.turn == [0, 1, 0]


@pytest.mark.parametrize("records, where, message", [
    (GOOD + [{"session": "b", "turn": 1, "new_tokens": 3, "output_tokens": 3}], ":4: field 'turn'",
     "turn 1 of session b again (first on line 1)"),
    ([GOOD[0]], ":1: field 'turn'", "session b has no turn 0"),
    (GOOD[1:] + [{"session": "b", "turn": 2, "new_tokens": 3, "output_tokens": 3}], ":3: field 'turn'",
     "no turn 1"),
    ([GOOD[2], dict(GOOD[0], think_time=-1)], ":2: field 'think_time'", "expected a finite number of seconds >= 0"),
    ([GOOD[2], dict(GOOD[0], arrival_time=4.0)], ":2: field 'arrival_time'", "only turn 0 has one"),
    ([dict(GOOD[2], think_time=1.0)], ":1: field 'think_time'", "turn 0 has no previous turn"),
    ([{k: v for k, v in GOOD[2].items() if k != "arrival_time"}], ":1: field 'arrival_time'", "missing on turn 0"),
    ([dict(GOOD[2], new_tokens=0)], ":1: field 'new_tokens'", "expected a positive integer"),
    ([dict(GOOD[2], thinktime=1)], ":1: field 'thinktime'", "unknown field"),
    ([{k: v for k, v in GOOD[2].items() if k != "output_tokens"}], ":1: field 'output_tokens'", "missing"),
    ([GOOD[2], dict(GOOD[0], prefix_hashes=[3])], ":2: field 'prefix_hashes'", "only turn 0 has them"),
    ([dict(GOOD[2], turn=-1)], ":1: field 'turn'", "expected a turn index >= 0"),
])
def test_bad_session_traces_name_file_line_and_field(tmp_path, records, where, message):
    path = write(tmp_path, records)
    with pytest.raises(TraceError) as e:
        load_trace(TraceConfig(path=str(path)))
    assert f"s.jsonl{where}" in str(e.value) and message in str(e.value)


def test_session_transforms_keep_conversations_whole_and_others_are_refused(tmp_path):
    path = write(tmp_path, GOOD)
    trace = load_trace(TraceConfig(path=str(path), rate_scale=2.0, max_requests=2, max_output_tokens=4))
    assert trace.sessions.session == ["b", "b"] and trace.report.over_max_requests == 1    # all of b, none of a
    assert [t.output_tokens for t in trace] == [4, 4] and trace.report.clipped_outputs == 1
    assert trace[0].arrival_time == 0.0                                # rebased
    with pytest.raises(TraceError, match="trace.sample_fraction.*does not apply to sessions"):
        load_trace(TraceConfig(path=str(path), sample_fraction=0.5))
    with pytest.raises(TraceError, match="trace.concurrency.*closed-loop users >= 1"):
        load_trace(TraceConfig(path=str(path), concurrency=0))


def test_any_trace_runs_as_concurrency_users(tmp_path):
    trace = load_trace(TraceConfig(path="traces/poisson.jsonl", concurrency=3, max_requests=20))
    assert trace.sessions.concurrency == 3 and len(trace) == 20 and set(trace.sessions.turn) == {0}
    assert "arrival times are ignored" in trace.sessions.mode
    with pytest.raises(TraceError, match="the native format records no sessions"):
        load_trace(TraceConfig(path="traces/poisson.jsonl", sessions=True))


def test_burstgpt_session_ids_become_conversations(tmp_path):
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Session ID,Elapsed time\n"
    rows = ["10,ChatGPT,100,20,120,Conversation log,x,1", "5,ChatGPT,40,10,50,Conversation log,y,1",
            "14,ChatGPT,150,30,180,Conversation log,x,1", "20,ChatGPT,60,0,60,Conversation log,x,1",
            "30,ChatGPT,25,5,30,Conversation log,x,1", "7,ChatGPT,33,3,36,Conversation log,,1"]
    path = tmp_path / "b.csv"
    path.write_text(header + "\n".join(rows) + "\n")
    skipped = Counter()
    sessions = {s.id: s for s in read_burstgpt_sessions(path, "b.csv", skipped)}
    x = sessions["x"]
    assert x.start == 10 and [(t.new_tokens, t.output_tokens) for t in x.turns] == [(100, 20), (30, 30), (25, 5)]
    assert [t.think_time for t in x.turns] == [0.0, 4.0, 16.0] and skipped["failed (0 response tokens)"] == 1
    assert len(sessions) == 3 and len(sessions["row-7"].turns) == 1       # no id: a conversation of its own
    trace = load_trace(TraceConfig(path=str(path), format="burstgpt", sessions=True))
    assert trace.sessions.session.count("x") == 3


def test_mooncake_hash_chains_become_conversations(tmp_path):
    recs = [{"timestamp": 0, "input_length": 1100, "output_length": 50, "hash_ids": [1, 2, 3]},
            {"timestamp": 500, "input_length": 700, "output_length": 9, "hash_ids": [1, 9]},
            {"timestamp": 3000, "input_length": 1500, "output_length": 40, "hash_ids": [1, 2, 4]},   # extends #0
            {"timestamp": 9000, "input_length": 2100, "output_length": 5, "hash_ids": [1, 2, 4, 5, 6]}]
    path = write(tmp_path, recs, "m.jsonl")
    sessions = read_mooncake_sessions(path, "m.jsonl", Counter())
    assert sorted(len(s.turns) for s in sessions) == [1, 3]
    (conversation,) = [s for s in sessions if len(s.turns) == 3]
    assert conversation.prefix_hashes == (1, 2, 3)
    assert [(t.new_tokens, t.think_time) for t in conversation.turns] == [(1100, 0.0), (350, 3.0), (560, 6.0)]


def test_the_generator_is_seeded_and_writes_a_session_trace(tmp_path, capsys):
    spec = SessionSpec(mean_turns=3.0, think_time=2.0)
    a, b = generate_sessions(spec, 200, seed=4), generate_sessions(spec, 200, seed=4)
    assert a == b and a != generate_sessions(spec, 200, seed=5)
    turns = [len(s.turns) for s in a]
    assert 2.4 < sum(turns) / len(turns) < 3.6 and min(turns) >= 1
    thinks = [t.think_time for s in a for t in s.turns[1:]]
    assert 1.5 < sum(thinks) / len(thinks) < 2.5 and a[0].start == 0.0
    out = tmp_path / "g.jsonl"
    assert trace_main(["generate", "--kind", "sessions", "-n", "12", "--think-time", "1", "-o", str(out)]) == 0
    assert "wrote 12 sessions" in capsys.readouterr().out
    assert len(load_trace(TraceConfig(path=str(out))).sessions.firsts) == 12


def test_inspect_says_what_a_session_trace_is_and_convert_refuses_it(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    assert trace_main(["inspect", str(path)]) == 0
    assert "sessions        2 (1.50 turns each)" in capsys.readouterr().out
    assert trace_main(["convert", str(path), str(tmp_path / "out.jsonl")]) == 2
    assert "is a session trace" in capsys.readouterr().err


def test_an_option_the_session_reader_lacks_is_named(tmp_path):
    path = write(tmp_path, GOOD)
    with pytest.raises(TraceError, match="extra.model.*not an option of the sessions reader of sessions"):
        load_trace(TraceConfig(path=str(path), extra={"model": "x"}))
