"""The step and settings objects: checked when made, frozen, and the README's Python example."""
import dataclasses
import re
from pathlib import Path

import pytest

from nslib.data.settings import Settings, settings_of
from nslib.model.step import Parallel, Step, parallel_of, split_options, step_of

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("kw, words", [
    (dict(batch=0, seq=8), "batch must be positive"),
    (dict(batch=2.5, seq=8), "batch must be an integer"),
    (dict(batch=1, seq=True), "seq must be a number"),
    (dict(batch=1, seq=8, mode="serve"), "mode must be one of"),
    (dict(batch=1, seq=8, dtype="int8"), "dtype"),
    (dict(batch=1, seq=8, imbalance=0.5), "imbalance"),
])
def test_a_bad_step_names_its_field(kw, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        Step(**kw)


def test_steps_are_frozen_values():
    a = Step(2.0, 16, "train")        # a whole float (JSON writers emit them) is an int
    assert a == Step(2, 16, "train") and isinstance(a.batch, int)
    assert hash(a) == hash(Step(2, 16, "train"))   # a memo key
    assert a.but(batch=4) == Step(4, 16, "train") and a.batch == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.batch = 3


def test_parallel_checks_degrees_and_link():
    assert not Parallel().multi and Parallel(tp=2).multi and Parallel(pp=1, microbatches=2).multi
    assert Parallel(dp=2, link=100).link == 100.0
    with pytest.raises(ValueError, match="dp must be an integer"):
        Parallel(dp=1.5)
    with pytest.raises(ValueError, match="link bandwidth"):
        Parallel(tp=2, link=float("inf"))


def test_flat_options_split_into_step_and_parallel():
    step, par = split_options(4, 128, "train", dtype="bf16", tp=2, link=50)
    assert step == Step(4, 128, "train", "bf16") and par == Parallel(tp=2, link=50)
    with pytest.raises(TypeError, match="unknown step option.*'dq'"):
        split_options(4, 128, dq=2)


def test_wrong_objects_are_named_with_the_fix():
    with pytest.raises(TypeError, match=r"Step\(batch, seq"):
        step_of((2, 16, "inf"))
    with pytest.raises(TypeError, match=r"Parallel\(dp="):
        parallel_of({"tp": 2})
    with pytest.raises(TypeError, match=r"Settings\(data="):
        settings_of({"quick": True})
    assert parallel_of(None) == Parallel() and settings_of(None) == Settings()


def test_settings_check_the_seed_and_copy_with_changes():
    with pytest.raises(ValueError, match="seed"):
        Settings(seed=-1)
    s = Settings(quick=1, seed=3)
    assert s.quick is True and s.but(progress=False) == Settings(quick=True, seed=3,
                                                                  progress=False)


def test_readme_python_example_runs(data_dir):
    """The README's example, as a user would paste it: a TP-2 training step priced and sized."""
    block = re.search(r"## Python API.*?```python\n(.*?)```", README.read_text(), re.S)
    assert block, "the README lost its Python API example"
    scope: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), scope)
    summary, memory = scope["summary"], scope["memory"]
    assert summary["parallel"]["kind"] == "tp" and summary["e2e_ms"] > 0
    assert memory.total > 0 and memory.capacity > 0
