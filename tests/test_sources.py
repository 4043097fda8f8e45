"""The code digest every cache key hashes (nslib.data.sources.code_digest): prose edits keep it,
code edits change it."""
from nslib.data.sources import code_digest, dependencies


def _digest(tmp_path, text: str) -> str:
    f = tmp_path / "m.py"
    f.write_text(text)
    return code_digest([f])


def test_prose_edits_keep_the_digest_and_code_edits_change_it(tmp_path):
    base = _digest(tmp_path, '"""Doc."""\n\ndef f(x):\n    """Twice."""\n    return 2 * x\n')
    prose = _digest(tmp_path, '"""Other doc."""\n\n\ndef f(x):  # why\n    """Two times x."""'
                              '\n    # a comment\n    return 2 * x\n')
    only_doc = _digest(tmp_path, 'def f(x):\n    return 2 * x\n')
    code = _digest(tmp_path, '"""Doc."""\n\ndef f(x):\n    """Twice."""\n    return 3 * x\n')
    string = _digest(tmp_path, 'def f(x):\n    "a"\n    return "a"\n')
    assert base == prose == only_doc
    assert code != base
    # a string that is the function's value is code, not a docstring
    assert string != _digest(tmp_path, 'def f(x):\n    "a"\n    return "b"\n')


def test_a_predictor_key_covers_its_code(tmp_path):
    files = dependencies("nslib.predictors.nslib_design", "nslib.predictors.training")
    names = {f.name for f in files}
    assert {"nslib_design.py", "neusight.py", "wave_laws.py", "training.py",
            "sources.py"} <= names
    assert "mixed_training.py" not in names and "layout.py" not in names
    assert len(code_digest(files)) == 16
