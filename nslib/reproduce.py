"""``nslib reproduce``: run every numbered notebook with papermill, in order, skipping those
whose notebook, parameters and data are unchanged; then write the figure index."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml
from tqdm.auto import tqdm

from nslib import __version__
from nslib.data.mixed_data import mixed_hash
from nslib.data.paths import (PROJECT_ROOT, atomic_write_text, data_root, figures_dir, hash_files,
                              mixed_root)
from nslib.data.sources import code_digest
from nslib.kernels.measured import data_hash

# the code's own picture (README), not a notebook's: its stage arrows are drawn in the order
# of Python sets of module names, which follows the string hash seed, so it is drawn in a
# child process with the seed fixed (the same code, the same picture)
_LAYOUT = ("import sys; from nslib.viz.figures import save_figure; "
           "from nslib.viz.layout import draw; save_figure(draw(), 'layout', sys.argv[1])")

NOTEBOOKS = PROJECT_ROOT / "notebooks"
RESULTS = PROJECT_ROOT / "results"
FIGURES = PROJECT_ROOT / "figures"
_NUMBERED = re.compile(r"^\d\d_.+\.ipynb$")


class NotebookFailed(RuntimeError):
    """A notebook raised; the message names it and the failing cell's error."""


def load_params(path: Path | None = None, quick: bool = False) -> dict[str, dict]:
    """``{notebook: params}`` for every numbered notebook, from ``notebooks/params.yaml``."""
    cfg = yaml.safe_load((path or NOTEBOOKS / "params.yaml").read_text()) or {}
    prof = (cfg.get("profiles") or {}).get("quick" if quick else "full", {})
    names = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb") if _NUMBERED.match(p.name))
    per = cfg.get("notebooks") or {}
    return {n: {**(cfg.get("common") or {}), **prof, **(per.get(n) or {})} for n in names}


def declared(nb_path: Path) -> set[str]:
    """Names declared in the notebook's ``parameters`` cell."""
    import papermill as pm
    return set(pm.inspect_notebook(str(nb_path)))


def library_hash() -> str:
    """Digest of what the library computes (:func:`nslib.data.sources.code_digest`: its code,
    not its prose): a notebook whose code changed under it is not up to date, whatever its
    own file says."""
    lib = Path(__file__).resolve().parent
    return code_digest(sorted(lib.rglob("*.py")))


def run(quick: bool = False, force: bool = False, only=None, data=None, out=None,
        results=None, progress: bool = True, params_file=None) -> list[dict]:
    """Run the notebooks; returns one record per notebook (name, status, seconds).

    ``out``: figures folder (default figures/); ``results``: executed notebooks and stamps
    (default results/<profile>/); ``params_file``: default notebooks/params.yaml.
    """
    import papermill as pm
    plan = load_params(Path(params_file) if params_file else None, quick=quick)
    if only:
        unknown = sorted(set(only) - set(plan))
        if unknown:
            raise ValueError(f"unknown notebook(s) {', '.join(unknown)} for --only; the "
                             f"notebooks are: {', '.join(plan)}")
        plan = {k: v for k, v in plan.items() if k in set(only)}
    figs, res, readme = output_paths(quick, out, results)
    figs = figures_dir(figs)
    res.mkdir(parents=True, exist_ok=True)
    root, dhash = str(data_root(data)), data_hash(data)
    code = library_hash()
    records = []
    for name, params in tqdm(plan.items(), desc="notebooks", disable=not progress):
        nb = NOTEBOOKS / f"{name}.ipynb"
        wanted = declared(nb)
        params = {k: v for k, v in params.items() if k in wanted}
        full = {**params, "data": root, "out": str(figs)}
        extra = [params, dhash, __version__, str(figs), code]
        if "mixed" in wanted:  # the 16-bit notebook: its data's content is part of the key
            full["mixed"] = str(mixed_root())
            extra.append(mixed_hash())
        key = hash_files([nb], extra=extra)
        stamp = res / f"{name}.stamp.json"
        if not force and stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
            records.append({"notebook": name, "status": "up to date", "seconds": 0.0})
            continue
        t0 = time.time()
        try:
            # the kernel's own start-up notes (its transport) are not the run's: errors only
            pm.execute_notebook(str(nb), str(res / f"{name}.ipynb"), parameters=full,
                                kernel_name="python3", cwd=str(NOTEBOOKS), progress_bar=False,
                                extra_arguments=["--IPKernelApp.log_level=ERROR"])
        except pm.PapermillExecutionError as e:
            raise NotebookFailed(f"notebook {name} failed in cell {e.exec_count}: "
                                 f"{e.ename}: {e.evalue}") from None
        secs = round(time.time() - t0, 1)
        atomic_write_text(stamp, json.dumps({"key": key, "params": params, "data_hash": dhash,
                                             "seconds": secs}, indent=1))
        records.append({"notebook": name, "status": "ran", "seconds": secs})
    draw_layout(figs)
    write_index(figs, res, dhash)
    if readme is not None:
        write_headline(figs, readme, "quick" if quick else "full", dhash)
        write_measured(figs, readme)
    return records


def output_paths(quick: bool, out=None, results=None) -> tuple[Path, Path, Path | None]:
    """(figures folder, executed-notebooks folder, README to update or None) of a run.

    The committed ``figures/`` and the README's headline tables belong to the full profile:
    a quick run writes to ``figures/quick/`` (git-ignored) and never updates the README, and
    a run with its own ``out`` folder leaves the README alone too.
    """
    profile = "quick" if quick else "full"
    figs = Path(out) if out is not None else (FIGURES / "quick" if quick else FIGURES)
    res = Path(results) if results else RESULTS / profile
    readme = PROJECT_ROOT / "README.md" if out is None and not quick else None
    return figs, res, readme


HEADLINE = {"11_reported_vs_reproduced.csv": "The paper side by side: mean end-to-end error "
                                             "(%) per GPU and mode over the configurations "
                                             "the paper reports: its own numbers, NeuSight as "
                                             "published reproduced here, nslib's design, and "
                                             "the baselines reported and reproduced",
            "03_baselines_kernel_error.csv": "Kernel-level MAPE (%) per predictor: class x "
                                             "(training GPUs, new GPUs): the paper's protocol",
            "03_baselines_logo.csv": "Kernel-level MAPE (%), leave-one-GPU-out: each training "
                                     "GPU held out in turn (mean over them, worst of them); "
                                     "design choices are made on this one",
            "02_kernelbench_summary.csv": "KernelBench level 1 (another harness; six GPU "
                                          "campaigns, five of GPUs never trained on, the "
                                          "T4 measured again): MAPE (%) per class, mean "
                                          "over the GPUs",
            "04_kernelbench_level3.csv": "KernelBench level 3 (whole small models, any "
                                         "PyTorch module traced): median APE (%) per "
                                         "campaign over the priced problems; trial_cv: "
                                         "median spread of each problem's timed trials "
                                         "(std / mean, %), how steady the machine was",
            "04_kernelbench_level2.csv": "KernelBench level 2 (short fused chains): median "
                                         "APE (%) per campaign",
            "04_kernelbench_level1_families.csv": "KernelBench level 1's single operators the "
                                                  "kernel table has no class for, one call "
                                                  "each: median APE (%) per family, every "
                                                  "campaign",
            "04_inf_summary.csv": "Inference: mean end-to-end error (%) per GPU",
            "05_train_summary.csv": "Training: mean end-to-end error (%) per GPU",
            "04_inf_logo.csv": "Inference, training GPUs' labels: mean end-to-end error (%) "
                               "under the paper's protocol and leave-one-GPU-out (each GPU "
                               "priced by the predictor trained without it)",
            "05_train_logo.csv": "Training, training GPUs' labels: mean end-to-end error (%) "
                                 "under the paper's protocol and leave-one-GPU-out",
            "04_inf_per_class_error.csv": "Inference: model-level error (%) per operator class "
                                          "against the label CSVs' per-operator times",
            "05_train_per_class_error.csv": "Training: model-level error (%) per operator "
                                            "class against the label CSVs' per-operator times",
            "06_fusion_summary.csv": "Fused kernels: mean error (%)",
            "07_distributed_summary.csv": "4-GPU DP / TP / PP: mean error (%)",
            "09_gemm_logo.csv": "BF16 GEMMs, leave-one-GPU-out MAPE (%) per held-out GPU",
            "09_attention_logo.csv": "FlashAttention (BF16), leave-one-GPU-out MAPE (%) per "
                                     "held-out GPU",
            "09_layer_check.csv": "fp16 transformer layers against vidur (layers of 256 tokens "
                                  "or more): median |error| (%) of the summed layer and per "
                                  "op class"}
_START, _END = "<!-- headline:start -->", "<!-- headline:end -->"


def write_headline(figs: Path, readme: Path, profile: str = "full", dhash: str = "") -> None:
    """Put the headline tables of the last reproduction into the README between markers,
    under a line naming the profile, the date and the data hash that made them."""
    import datetime

    import pandas as pd
    parts = [f"_Made by `nslib reproduce` ({profile} profile) on "
             f"{datetime.date.today().isoformat()}, data hash {dhash or '?'}._\n"]
    for name, title in HEADLINE.items():
        path = figs / name
        if path.exists():
            header = [0, 1] if name.startswith("03_") else 0
            df = pd.read_csv(path, index_col=0, header=header)
            if isinstance(df.columns, pd.MultiIndex):
                df.columns = [" ".join(c) for c in df.columns]
            parts.append(f"**{title}** ({name})\n\n{df.round(1).to_markdown()}\n")
    if len(parts) > 1:
        _between_markers(readme, _START, _END, "\n".join(parts))


def _between_markers(readme: Path, start: str, end: str, block: str) -> None:
    """Put ``block`` into ``readme`` between the lines ``start`` and ``end`` (atomically),
    replacing what was there; a README without both markers is left as it is."""
    text = readme.read_text()
    if start not in text or end not in text:
        return
    head, rest = text.split(start, 1)
    atomic_write_text(readme, head + start + "\n" + block + end + rest.split(end, 1)[1])


# the column names of notebook 14's tables as the README shows them
_SHOWN = {"nslib": "nslib", "neusight": "NeuSight as published", "roofline": "roofline",
          "habitat": "Habitat", "li": "Li et al.", "roofline_eff": "roofline x fitted efficiency",
          "xgboost": "XGBoost"}
_M_START, _M_END = "<!-- measured:start -->", "<!-- measured:end -->"


def measured_tables(figs: Path) -> str:
    """Markdown of each GPU measured with ``nslib collect`` whose notebook-14 tables are in
    ``figs`` (``14_fp32_<gpu>.csv``, ``14_tensor_<gpu>.csv``, ``14_steps_<gpu>.csv``): MAPE (%)
    per FP32 kernel class, per 16-bit kernel kind and, for the model steps, the mean error per
    dtype, each row labelled with its count. Empty when no such table is there."""
    import pandas as pd

    parts = []
    for fp32 in sorted(figs.glob("14_fp32_*.csv")):
        tag = fp32.stem.removeprefix("14_fp32_")
        parts.append(f"`{tag}` (`figures/14_*_{tag}.md`), MAPE %:\n")
        parts.append(_shown(pd.read_csv(fp32, index_col=0), "FP32 kernels"))
        tensor = figs / f"14_tensor_{tag}.csv"
        if tensor.exists():
            tab = pd.read_csv(tensor)
            name = tab["kind"].where(tab["kind"] == tab["phase"],
                                     tab["kind"] + ", " + tab["phase"])
            parts.append(_shown(tab.drop(columns=["kind", "phase"]).set_index(
                name.str.replace("gemm", "GEMM")), "16-bit kernels"))
        steps = figs / f"14_steps_{tag}.csv"
        if steps.exists():
            rows = pd.read_csv(steps)
            errs = [c for c in rows.columns if c.startswith("err_")]
            by = rows.groupby(rows["dtype"].str.upper(), sort=True)
            tab = by[errs].mean().rename(columns=lambda c: c.removeprefix("err_"))
            parts.append(_shown(tab.assign(n=by.size()), "model steps"))
    return "\n".join(parts)


def _shown(tab, what: str) -> str:
    """``tab`` (rows: a class; MAPE columns named by predictor, ``n``) as a Markdown table
    whose first column is ``<what> (n)``, one decimal."""
    cols = [c for c in tab.columns if c in _SHOWN]
    out = tab[cols].round(1).rename(columns=_SHOWN)
    out.index = [f"{i} ({int(n):,})" for i, n in zip(tab.index, tab["n"])]
    out.index.name = f"{what} (n)"
    return out.to_markdown(floatfmt=".1f").replace("nan", "-") + "\n"


def write_measured(figs: Path, readme: Path) -> None:
    """Put :func:`measured_tables` into the README between its markers (left as it is when
    the README has no markers or ``figs`` no notebook-14 table)."""
    block = measured_tables(figs)
    if block:
        _between_markers(readme, _M_START, _M_END, block)


def draw_layout(figs) -> None:
    """Draw the package layout figure into the folder ``figs`` (see :data:`_LAYOUT`)."""
    subprocess.run([sys.executable, "-c", _LAYOUT, str(figs)], check=True,
                   env={**os.environ, "PYTHONHASHSEED": "0"}, stdout=subprocess.DEVNULL)


def write_index(figs: Path, res: Path, dhash: str) -> Path:
    """``figures/README.md``: each figure and table, its notebook, parameters and data hash."""
    stamps = {p.name.removesuffix(".stamp.json"): json.loads(p.read_text())
              for p in sorted(res.glob("*.stamp.json"))}
    # a file whose notebook has no stamp here (a fresh checkout that ran some notebooks only)
    # keeps the row the index already gives it
    old = {}
    if (figs / "README.md").is_file():
        for row in (figs / "README.md").read_text().splitlines():
            m = re.match(r"\| \[([^\]]+)\]", row)
            if m:
                old[m[1]] = row
    lines = ["# Figures and tables", "",
             "Generated by `nslib reproduce` (do not edit). Each file names its notebook by its "
             "number prefix.", "", "| file | notebook | parameters | data hash |",
             "|---|---|---|---|"]
    for f in sorted(figs.iterdir()):
        if f.suffix not in (".png", ".pdf", ".csv", ".md") or f.name == "README.md":
            continue
        nb = next((n for n in stamps if f.name.startswith(n[:3])), None)
        if nb is None and f.stem != "layout" and f.name in old:
            lines.append(old[f.name])
            continue
        st = stamps.get(nb, {})
        source = nb or ("`python -m nslib.viz.layout`" if f.stem == "layout" else "?")
        lines.append(f"| [{f.name}]({f.name}) | {source} | "
                     f"`{json.dumps(st.get('params', {}), sort_keys=True)}` | "
                     f"{st.get('data_hash', dhash)} |")
    return atomic_write_text(figs / "README.md", "\n".join(lines) + "\n")
