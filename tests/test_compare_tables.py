"""benchmarks/compare_tables.py: the before/after check of a reproduction's tables."""
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "compare_tables", Path(__file__).resolve().parents[1] / "benchmarks" / "compare_tables.py")
ct = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ct)


def _write(folder: Path, name: str, text: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)


def test_same_equal_and_different_tables(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, "same.csv", "x,y\n1,2\n")
    _write(b, "same.csv", "x,y\n1,2\n")
    _write(a, "digits.csv", "x\n0.5\n")
    _write(b, "digits.csv", "x\n0.50\n")
    _write(a, "moved.csv", "x,y\n1,2.0\n")
    _write(b, "moved.csv", "x,y\n1,2.5\n")
    _write(a, "gone.csv", "x\n1\n")
    out = ct.compare_folders(a, b)
    assert out["same.csv"] == "same"
    assert out["digits.csv"] == "equal values"
    assert out["moved.csv"] == "y: max |diff| 0.5"
    assert out["gone.csv"] == "missing in after"
    assert ct.main([str(a), str(b)]) == 1
    assert ct.main([str(a), str(a)]) == 0
