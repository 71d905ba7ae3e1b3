"""The doctor on runs like the eight a new user tried (issue 55's table): a user's own 2-layer model with a
character-level tokenizer, warmed up on "What is a+b?", a plain GRPOConfig, the user's own reward functions, trained
as the user runs it and diagnosed by the command line from the run's folder with `--task user_train.py:REWARD_FUNCS`.
Each run is drawn by `benchmarks/stranger_runs.py` from the corpus's tuning half (even seeds; the held-out half is
only ever scored as a whole, by `benchmarks/stranger_corpus.py report`):

    seed 50  a learning rate that blows the policy up (beta 0.04, captured at step 3)   the update first, the rest after
    seed 10  top_p 0.3-0.5: groups of identical completions                            identical_groups, zero-std its symptom
    seed 26  an extra reward that pays for length                                      length_reward
    seed 28  rewards in the thousands with scale_rewards='none'                        large_advantages
    seed 18  the model's dropout left on                                               dropout
    seed  8  clean, a, b in 0..49, closeness, chat prompts                             nothing at warning or above
    seed 56  clean, a, b in 0..49, exact match, GPT-2                                  nothing at warning or above
    seed 52  a reward that divides by zero on every right answer                       the crash recorded, the traceback the user's
"""

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from stranger_corpus import Corpus, causes, diagnose, runs_of, train  # noqa: E402
from stranger_runs import expects_crash  # noqa: E402

pytestmark = pytest.mark.slow  # `make test-slow`: eight runs built, trained and diagnosed (about ten minutes)

FIRST = {10: ("identical_groups",), 26: ("length_reward",), 28: ("large_advantages",), 18: ("dropout",)}
CLEAN = (8, 56)
BLOWUP, CRASH = 50, 52
LOUD = ("problem", "warning")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """seed -> {"train": train.json, "findings": the doctor's findings (None for the crash)}."""
    corpus = Corpus(tmp_path_factory.mktemp("strangers"), jobs=2)
    runs = runs_of([BLOWUP, *FIRST, *CLEAN, CRASH], quick=False)
    trained = {r["seed"]: r for r in train(corpus, runs)}
    sub = diagnose(corpus, [r for r in runs if not expects_crash(r)], horizon=None, half="test")
    out = {}
    for run in runs:
        report = corpus.folder(run) / sub / "doctor.json"
        out[run.seed] = {
            "train": trained[run.seed],
            "folder": corpus.folder(run),
            "findings": json.loads(report.read_text())["findings"] if report.exists() else None,
        }
    return out


def loud(findings: list[dict]) -> dict[str, dict]:
    return {f["id"]: f for f in findings if f["severity"] in LOUD}


@pytest.mark.parametrize("seed", sorted(FIRST))
def test_the_planted_cause_is_first(corpus, seed):
    run = corpus[seed]
    assert run["findings"] is not None, f"seed {seed}: not diagnosed ({run['train'].get('stderr_tail', '')[-800:]})"
    ranked = causes(run["findings"])
    assert ranked[:1] == [FIRST[seed][0]], f"seed {seed}: the doctor's causes {ranked}, not {FIRST[seed]} first"


def test_identical_groups_are_the_cause_and_their_zero_std_groups_a_symptom(corpus):
    found = loud(corpus[10]["findings"])
    if "zero_std_groups" in found:  # every group of one text has one reward: named, as a symptom
        assert found["zero_std_groups"]["symptom_of"], f"zero-std groups ranked as a cause: {found['zero_std_groups']}"
    assert "constant_reward" not in found, f"a correct reward blamed for identical groups: {found['constant_reward']}"


def test_a_learning_rate_blowup_is_first_and_what_it_broke_after_it(corpus):
    findings = corpus[BLOWUP]["findings"]
    ranked = causes(findings)
    assert ranked[:1] in (["update_size"], ["kl_blowup"]), f"the blow-up is not first: {ranked}"
    for f in findings:  # what it broke follows it; what the run's first weights already showed is not its doing
        if f["severity"] in LOUD and "onset" in f["evidence"]:
            there_before = "there before" in f["summary"] and (f["evidence"].get("at_start") or {}).get(
                "flat_functions"
            )
            assert (f["symptom_of"] and "began at step" in f["summary"]) or there_before, (
                f"{f['id']} began after the jump and is neither its symptom nor there at the start: {f}"
            )


@pytest.mark.parametrize("seed", CLEAN)
def test_a_clean_run_is_quiet(corpus, seed):
    found = loud(corpus[seed]["findings"])
    assert not found, f"clean seed {seed}: {[(i, f['severity'], f['summary']) for i, f in found.items()]}"


def test_a_crash_in_the_users_reward_is_theirs_and_recorded(corpus):
    run = corpus[CRASH]
    done, folder = run["train"], run["folder"]
    assert done["returncode"] not in (0, None), f"the run that divides by zero finished: {done}"
    tail = done["stderr_tail"]
    assert "ZeroDivisionError" in tail and "user_train.py" in tail, f"not the user's error and frame:\n{tail}"
    assert "in your reward function 'inverse_error'" in tail, f"the note does not name the function:\n{tail}"
    crashes = list((folder / "out" / "captures").glob("crash-step-*/crash.json"))
    assert crashes, f"no crash folder under {folder / 'out' / 'captures'}: {done['captures_written']}"
    health = (folder / "out" / "captures" / "health.jsonl").read_text().splitlines()
    assert any("crashed" in json.loads(line) for line in health), f"no health line says it crashed: {health}"
