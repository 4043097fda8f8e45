"""The interactive GPU explorer (ipywidgets): its callbacks read the controls and call the plain
functions of :mod:`nslib.explore.whatif`, then draw :func:`nslib.explore.plots.plot_scenario`.

Build it with :func:`build_explorer` (or :func:`render` inside a cell).
"""
from __future__ import annotations

import html
import json

from nslib.data.gpus import GPU
from nslib.data.paths import data_root
from nslib.data.settings import Settings, settings_of
from nslib.explore.gpus import (INT_FIELDS, SLIDER_FIELDS, datasheet_summary, explorer_gpus,
                                hypothetical_gpu)
from nslib.explore.pasted import parse_pasted_config
from nslib.explore.plots import plot_scenario
from nslib.explore.whatif import TOP_KERNELS, scenario
from nslib.kernels.dtypes import DTYPES
from nslib.model.inputs import MODES, resolve_gpu
from nslib.model.step import Step, step_of
from nslib.predictors import available

PASTED = "(pasted config)"   # the model dropdown's entry for a pasted config
START = Step(4, 1024)        # the workload the controls start at
CONTROL_WIDTH = "420px"
GPU_LIST_ROWS = 8            # at most this many GPUs visible in the list at once
# the sliders' factors on the base GPU's datasheet: powers of two, from 1/8 to 16
SLIDER_LOG2_MIN, SLIDER_LOG2_MAX, SLIDER_LOG2_STEP = -3, 4, 0.25
SLIDER_EPS = 1e-9            # a slider this close to 1 leaves its number unchanged
MAX_BATCH, MAX_SEQ = 1 << 16, 1 << 20
SUMMARY_COLUMNS = ["gpu", "e2e_ms", "interval_lo_ms", "interval_hi_ms", "fw_ms", "bw_ms", "n_kernels",
                   "memory_gb", "fits"]


def _gpu_options(gpus: dict[str, GPU]) -> list[tuple[str, str]]:
    names = [g.name for g in gpus.values()]
    return [(g.name if names.count(g.name) == 1 else f"{g.name} [{k}]", k)
            for k, g in gpus.items()]


def _model_names(data=None) -> list[str]:
    folder = data_root(data) / "data" / "DLmodel_configs"
    return sorted(p.stem for p in folder.glob("*.json"))


class _UserError(Exception):
    """A problem with the user's input: shown as its message alone."""


class Explorer:
    """The explorer UI; ``widget`` is the ipywidgets box, :meth:`update` recomputes.

    Every control calls :meth:`update`, which reads the controls, calls
    :func:`nslib.explore.whatif.scenario` and draws :func:`nslib.explore.plots.plot_scenario`
    into ``output``; warnings and errors go to ``message`` as text (never a traceback).
    ``result`` holds the last scenario, ``error`` the last error message (or None),
    ``seconds`` the time of the last update's prediction.
    """

    def __init__(self, gpus=None, model="gpt2_large", step: Step = START, predictor="nslib", *,
                 top=TOP_KERNELS, hypothetical=None, auto=True,
                 settings: Settings | None = None):
        import ipywidgets as W

        self.settings, self.top = settings_of(settings), top
        self.data = self.settings.data
        self.result, self.error, self.seconds, self.figure = None, None, None, None
        self._busy = False
        self.gpus = explorer_gpus(self.data)
        self._gpu_controls(W, gpus, dict(hypothetical or {}))
        self._workload_controls(W, model, step_of(step), predictor)
        self.message = W.HTML()
        self.output = W.Output()
        for w in (self.gpu_select, self.base_gpu, self.use_custom, self.custom_name,
                  *self.sliders.values(), self.model, self.batch, self.seq, self.mode,
                  self.dtype, self.predictor):
            w.observe(self._changed, names="value")
        self.pasted.observe(self._pasted_changed, names="value")
        self.button.on_click(lambda _: self.update())

        left = W.VBox([W.HTML("<b>GPUs</b>"), self.gpu_select, W.HTML("<b>what if</b>"),
                       self.use_custom, self.base_gpu, self.custom_name,
                       *self.sliders.values(), self.custom_info])
        right = W.VBox([W.HTML("<b>workload</b>"), self.model, self.pasted, self.batch, self.seq,
                        self.mode, self.dtype, self.predictor, self.button])
        self.widget = W.VBox([W.HBox([left, right]), self.message, self.output])
        self._show_custom()
        if auto:
            self.update()

    def _gpu_controls(self, W, gpus, hyp: dict) -> None:
        """The GPU list, and the hypothetical GPU's base, name and sliders."""
        opts = _gpu_options(self.gpus)
        keys = [k for _, k in opts]
        chosen = [resolve_gpu(g, self.data).key for g in (gpus or [])]
        chosen = [k for k in chosen if k in keys] or keys[-1:]
        self.gpu_select = W.SelectMultiple(options=opts, value=tuple(chosen),
                                           rows=min(GPU_LIST_ROWS, len(opts)),
                                           description="GPUs", layout=W.Layout(width=CONTROL_WIDTH))
        self.base_gpu = W.Dropdown(options=opts, value=chosen[0], description="base GPU",
                                   layout=W.Layout(width=CONTROL_WIDTH))
        self.use_custom = W.Checkbox(value=bool(hyp), description="add a hypothetical GPU",
                                     indent=False)
        self.custom_name = W.Text(value="", placeholder="name (optional)", description="name",
                                  layout=W.Layout(width=CONTROL_WIDTH))
        self.sliders = {f: W.FloatLogSlider(value=float(hyp.get(f, 1.0)), base=2,
                                            min=SLIDER_LOG2_MIN, max=SLIDER_LOG2_MAX,
                                            step=SLIDER_LOG2_STEP, description=f"{f} x",
                                            continuous_update=False, readout_format=".3g",
                                            style={"description_width": "110px"},
                                            layout=W.Layout(width=CONTROL_WIDTH))
                        for f in SLIDER_FIELDS}
        self.custom_info = W.HTML()

    def _workload_controls(self, W, model, step: Step, predictor) -> None:
        """The model (or a pasted config), batch, sequence, mode, dtype and predictor."""
        models = _model_names(self.data)
        start = model if isinstance(model, str) and model in models else PASTED
        self.model = W.Dropdown(options=models + [PASTED], value=start, description="model")
        pasted = json.dumps(model, indent=1) if isinstance(model, dict) else ""
        self.pasted = W.Textarea(value=pasted,
                                 placeholder="paste a HuggingFace config.json here",
                                 layout=W.Layout(width=CONTROL_WIDTH, height="120px"),
                                 continuous_update=False)
        self.batch = W.BoundedIntText(value=step.batch, min=1, max=MAX_BATCH,
                                      description="batch")
        self.seq = W.BoundedIntText(value=step.seq, min=1, max=MAX_SEQ, description="seq")
        self.mode = W.Dropdown(options=list(MODES), value=step.mode, description="mode")
        self.dtype = W.Dropdown(options=list(DTYPES), value=step.dtype, description="dtype")
        preds = list(available())
        self.predictor = W.Dropdown(options=preds, value=predictor if predictor in preds
                                    else preds[0], description="predictor")
        self.button = W.Button(description="update", icon="refresh")

    # ----- display
    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # ----- callbacks
    def _changed(self, change=None):
        if not self._busy:
            self.update()

    def _pasted_changed(self, change):
        if self._busy:
            return
        if change["new"].strip() and self.model.value != PASTED:
            self._busy = True
            try:
                self.model.value = PASTED
            finally:
                self._busy = False
        self.update()

    def custom_gpu(self) -> GPU | None:
        """The hypothetical GPU the controls describe (None when unticked)."""
        if not self.use_custom.value:
            return None
        base = self.gpus[self.base_gpu.value]
        ov = {}
        for f, s in self.sliders.items():
            if abs(s.value - 1.0) > SLIDER_EPS:
                v = getattr(base, f) * s.value
                ov[f] = max(1, int(round(v))) if f in INT_FIELDS else float(v)
        return hypothetical_gpu(base, name=self.custom_name.value.strip() or None, **ov)

    def _show_custom(self):
        try:
            g = self.custom_gpu()
        except ValueError as e:
            self.custom_info.value = f"<span style='color:#b00'>{html.escape(str(e))}</span>"
            return
        if g is None:
            self.custom_info.value = ""
            return
        self.custom_info.value = (f"<small>{html.escape(g.name)}: "
                                  f"{html.escape(datasheet_summary(g))}</small>")

    def _model_value(self):
        if self.model.value != PASTED:
            return self.model.value, None
        return parse_pasted_config(self.pasted.value)

    def _say(self, warnings=(), error=None, note=None, details=()):
        parts = []
        if error:
            parts.append(f"<div style='color:#b00'><b>Error:</b> {html.escape(error)}</div>")
        for i, w in enumerate(warnings):
            if i == 0 and details:  # the range line: one line, its figures folded
                items = "".join(f"<li>{html.escape(d)}</li>" for d in details)
                parts.append(f"<details style='color:#8a5a00'><summary>&#9888; "
                             f"{html.escape(w)}</summary><ul>{items}</ul></details>")
                continue
            parts.append(f"<div style='color:#8a5a00'>&#9888; {html.escape(w)}</div>")
        if note:
            parts.append(f"<div style='color:#555'><small>{html.escape(note)}</small></div>")
        self.message.value = "".join(parts)

    def _scenario(self) -> dict:
        """The scenario the controls ask for; _UserError for what the user must fix."""
        model, err = self._model_value()
        if err:
            raise _UserError(err)
        gpus = list(self.gpu_select.value)
        custom = self.custom_gpu()
        if custom is not None:
            gpus.append(custom)
        if not gpus:
            raise _UserError("select at least one GPU (or tick 'add a hypothetical GPU')")
        self._say(note="computing... (the first use of a predictor trains or loads it)")
        try:
            step = Step(self.batch.value, self.seq.value, self.mode.value, self.dtype.value)
        except ValueError as e:
            raise _UserError(str(e)) from None
        return scenario([self.gpus[g] if isinstance(g, str) else g for g in gpus], model, step,
                        self.predictor.value, top=self.top, settings=self.settings)

    def _draw(self, res: dict) -> None:
        """The scenario's figure and summary table into ``output``."""
        import matplotlib.pyplot as plt
        from IPython.display import clear_output, display

        fig = plot_scenario(res)
        self.figure = fig
        with self.output:
            clear_output(wait=True)
            display(fig)
            display(res["summary"][SUMMARY_COLUMNS].round(2).set_index("gpu"))
        plt.close(fig)

    def update(self):
        """Recompute from the controls and redraw; returns the scenario dict or None."""
        from IPython.display import clear_output

        self._show_custom()
        self.error = None
        try:
            res = self._scenario()
        except Exception as e:  # noqa: BLE001 - every failure becomes a message, not a traceback
            msg = str(e) if isinstance(e, _UserError) else f"{type(e).__name__}: {e}"
            self.error = msg.strip("'\"")
            self._say(error=self.error)
            with self.output:
                clear_output(wait=True)
            return None
        self.result, self.seconds = res, res["seconds"]
        self._draw(res)
        self._say(res["warnings"], note=f"predicted in {res['seconds']:.2f} s",
                  details=res.get("range_details", ()))
        return res


def build_explorer(gpus=None, model="gpt2_large", step: Step = START, predictor="nslib", *,
                   top=TOP_KERNELS, hypothetical=None, auto=True,
                   settings: Settings | None = None) -> Explorer:
    """Build the explorer (display the returned object, or its ``widget``, in a notebook).

    ``gpus``: names/aliases selected at start; ``step``: the workload the controls start at (a
    :class:`nslib.model.step.Step`); ``hypothetical``: slider factors to start with, e.g.
    ``{"mem_bw": 2}`` (ticks 'add a hypothetical GPU'); ``auto``: run the first update now;
    ``settings``: the data and training profile. See :class:`Explorer`.
    """
    return Explorer(gpus, model, step, predictor, top=top, hypothetical=hypothetical,
                    auto=auto, settings=settings)


def render(**kwargs) -> Explorer:
    """Build the explorer and display it now (for use inside a cell); returns it."""
    from IPython.display import display
    ex = build_explorer(**kwargs)
    display(ex.widget)
    return ex


__all__ = ["Explorer", "build_explorer", "render", "PASTED"]
