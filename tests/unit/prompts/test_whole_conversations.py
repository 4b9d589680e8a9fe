"""``turns: all``: a prompt is the whole conversation, original turns kept for the engine."""

from __future__ import annotations

from pathlib import Path

from include.prompts import prepare_prompts, read_shard
from include.prompts.schemas import RawTurn
from include.prompts.turns import POLICIES, WHOLE, to_messages
from include.settings.deployment import bundled_catalogue
from include.storage import LocalStore
from synthetic_sources import write_sample_set


def _sources(d: Path, **extra: object) -> list[dict]:
    out = []
    for s in (e.model_dump() for e in bundled_catalogue().values()):
        s["path"] = str(d / Path(s["path"]).name)
        out.append({**s, **extra.get(s["name"], {})})  # type: ignore[arg-type]
    return out


def _prompts(settings) -> list[dict]:
    store = LocalStore(settings.run_uri)
    manifest = prepare_prompts(settings, store)
    return [p for i in range(len(manifest["shards"])) for p in read_shard(store, i)]


def test_whole_conversation_keeps_every_turn_and_unwraps_tool_results() -> None:
    turns = [RawTurn("system", "tools here"), RawTurn("human", "q"),
             RawTurn("gpt", '<tool_call>{"name": "f", "arguments": {}}</tool_call>'),
             RawTurn("tool", "<tool_response>\n{\"x\": 1}\n</tool_response>"),
             RawTurn("gpt", "answer")]
    messages = to_messages(turns, WHOLE)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[3]["content"] == '{"x": 1}'
    assert messages[2]["content"] == turns[2].content  # the original call, for pairing
    # The cut policies still stop where they did.
    assert [m["role"] for m in to_messages(turns, POLICIES[0])] == ["system", "user"]


def test_turns_all_per_source_or_per_run_marks_the_records(make_settings, tmp_path) -> None:
    d = tmp_path / "samples"
    write_sample_set(d, n=30)
    names = [e.name for e in bundled_catalogue().values()]
    hermes = next(n for n in names if "hermes" in n)
    per_source = _prompts(make_settings(_sources(d, **{hermes: {"turns": "all"}})))
    whole = [p for p in per_source if p.get("turns") == "all"]
    assert whole and {p["source"] for p in whole} == {hermes}
    assert all(p["call_format"] == "tool_call" for p in whole)
    assert any(m["role"] == "assistant" for p in whole for m in p["messages"])
    first = [p for p in per_source if p["source"] != hermes]
    assert first and all("turns" not in p for p in first)
    assert all(p["messages"][-1]["role"] == "user" for p in first)

    everything = _prompts(make_settings(_sources(d), turns="all", run_name="t2"))
    assert everything and all(p["turns"] == "all" for p in everything)
    formats = {p["source"]: p["call_format"] for p in everything}
    assert formats["agentinstruct"] == "agent_action" and formats[hermes] == "tool_call"


def test_prompts_prepared_before_turns_existed_are_still_reused(make_settings, tmp_path) -> None:
    from include.settings import PREPARATION_SETTINGS

    d = tmp_path / "samples"
    write_sample_set(d, n=5)
    first = make_settings(_sources(d))
    recorded = first.subset(PREPARATION_SETTINGS)
    # What a manifest written before `turns` existed records: no such key anywhere.
    assert "turns" not in recorded and all("turns" not in s for s in recorded["sources"])
    manifest = {"preparation_settings": recorded}
    assert first.preparation_differences(manifest) == []
    whole = make_settings(_sources(d), turns="all")
    assert whole.preparation_differences(manifest) == ["turns"]
    hermes = make_settings(_sources(d, hermes_fc={"turns": "all"}))
    assert hermes.preparation_differences(manifest) == ["sources"]
    assert len({first.fingerprint(PREPARATION_SETTINGS), whole.fingerprint(PREPARATION_SETTINGS),
                hermes.fingerprint(PREPARATION_SETTINGS)}) == 3
