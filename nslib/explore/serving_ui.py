"""The explorer's serving view (ipywidgets): tokens/s and TTFT against concurrency per GPU,
for a model, engine, tensor-parallel degree and request lengths; a hypothetical GPU (a real
one with its bandwidth, BF16 peak or memory scaled) can join the comparison.

Build it with :func:`build_serving_explorer`; its callbacks call the plain function
:func:`nslib.explore.serving.serving_curves` and draw
:func:`nslib.viz.serving_plots.throughput_curves`. Errors are shown as messages.
"""
from __future__ import annotations

import html

from nslib.data.serving_sample import model_configs
from nslib.data.settings import Settings, settings_of
from nslib.explore.gpus import explorer_gpus, hypothetical_gpu
from nslib.explore.serving import serving_curves
from nslib.model.serving import FRAMEWORKS, Workload
from nslib.viz.serving_plots import throughput_curves

WIDTH = "420px"
# what a hypothetical serving GPU may scale: bandwidth, BF16 peak, memory
SCALED = ("mem_bw", "bf16_gflops", "mem_gb")
TP_CHOICES = (1, 2, 4, 8)
MOST_CHOICES = (16, 64, 256, 1024)
START = Workload(tp=2)   # what the controls start at
TABLE_COLUMNS = ["gpu", "concurrency", "running", "ttft_ms", "tpot_ms", "tokens_per_s_gpu"]


class ServingExplorer:
    """The serving view; ``widget`` is the ipywidgets box, :meth:`update` recomputes.
    ``result`` holds the last :func:`serving_curves` dict, ``error`` the last error (or
    None)."""

    def __init__(self, gpus=None, model="Qwen/Qwen3-32B", workload: Workload = START, *,
                 most=256, hypothetical=None, auto=True, settings: Settings | None = None):
        import ipywidgets as W
        self.settings = settings_of(settings)
        self.data, self.result, self.error, self.figure = self.settings.data, None, None, None
        w = workload
        self.gpus = {k: g for k, g in explorer_gpus(self.data).items() if g.bf16_gflops}
        opts = [(g.name, k) for k, g in self.gpus.items()]
        keys = [k for _, k in opts]
        chosen = [k for k, g in self.gpus.items()
                  if any(str(c) in (k, g.name) for c in (gpus or []))] or keys[:1]
        self.gpu_select = W.SelectMultiple(options=opts, value=tuple(chosen), rows=6,
                                           description="GPUs", layout=W.Layout(width=WIDTH))
        self.use_custom = W.Checkbox(value=bool(hypothetical), indent=False,
                                     description="add a hypothetical GPU")
        self.base_gpu = W.Dropdown(options=opts, value=chosen[0], description="base GPU",
                                   layout=W.Layout(width=WIDTH))
        hyp = dict(hypothetical or {})
        self.sliders = {f: W.FloatLogSlider(value=float(hyp.get(f, 1.0)), base=2, min=-2,
                                            max=3, step=0.25, description=f"{f} x",
                                            continuous_update=False,
                                            style={"description_width": "110px"},
                                            layout=W.Layout(width=WIDTH)) for f in SCALED}
        models = list(model_configs())
        self.model = W.Dropdown(options=models, value=model if model in models else models[0],
                                description="model", layout=W.Layout(width=WIDTH))
        self.engine = W.Dropdown(options=list(FRAMEWORKS), value=w.framework,
                                 description="engine")
        self.tp = W.Dropdown(options=list(TP_CHOICES), value=w.tp, description="tp")
        self.isl = W.BoundedIntText(value=w.isl, min=1, max=1 << 20, description="prompt")
        self.osl = W.BoundedIntText(value=w.osl, min=1, max=1 << 20, description="output")
        self.most = W.Dropdown(options=list(MOST_CHOICES), value=most,
                               description="up to")
        self.message, self.output = W.HTML(), W.Output()
        for w in (self.gpu_select, self.use_custom, self.base_gpu, *self.sliders.values(),
                  self.model, self.engine, self.tp, self.isl, self.osl, self.most):
            w.observe(lambda _: self.update(), names="value")
        left = W.VBox([self.gpu_select, self.use_custom, self.base_gpu, *self.sliders.values()])
        right = W.VBox([self.model, self.engine, self.tp, self.isl, self.osl, self.most])
        self.widget = W.VBox([W.HBox([left, right]), self.message, self.output])
        if auto:
            self.update()

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def chosen_gpus(self) -> list:
        """The selected GPUs, and the hypothetical one when ticked."""
        out = [self.gpus[k] for k in self.gpu_select.value]
        if self.use_custom.value:
            base = self.gpus[self.base_gpu.value]
            scaled = {f: getattr(base, f) * s.value for f, s in self.sliders.items()
                      if abs(s.value - 1.0) > 1e-9}
            out.append(hypothetical_gpu(base, **scaled))
        return out

    def _say(self, notes=(), error=None, note=None):
        parts = [f"<div style='color:#b00'><b>Error:</b> {html.escape(error)}</div>"] \
            if error else []
        parts += [f"<div style='color:#8a5a00'>&#9888; {html.escape(n)}</div>" for n in notes]
        if note:
            parts.append(f"<div style='color:#555'><small>{html.escape(note)}</small></div>")
        self.message.value = "".join(parts)

    def update(self):
        """Recompute from the controls and redraw; returns the result dict or None."""
        import matplotlib.pyplot as plt
        from IPython.display import clear_output, display
        self.error = None
        try:
            gpus = self.chosen_gpus()
            if not gpus:
                raise ValueError("select at least one GPU (or tick 'add a hypothetical GPU')")
            work = Workload(self.isl.value, self.osl.value, self.engine.value, self.tp.value)
            res = serving_curves(gpus, self.model.value, work, most=self.most.value,
                                 settings=self.settings)
            if res["curves"].empty:
                raise ValueError("no GPU could be forecast: " + "; ".join(res["notes"]))
        except Exception as e:  # noqa: BLE001 - every failure becomes a message
            self.error = str(e).strip("'\"")
            self._say(error=self.error)
            with self.output:
                clear_output(wait=True)
            return None
        self.result = res
        fig = throughput_curves(res["curves"])
        self.figure = fig
        with self.output:
            clear_output(wait=True)
            display(fig)
            last = res["curves"].groupby("gpu", sort=False).tail(1)
            display(last[TABLE_COLUMNS].round(1).set_index("gpu"))
        plt.close(fig)
        self._say(res["notes"], note=f"forecast in {res['seconds']:.2f} s")
        return res


def build_serving_explorer(**kwargs) -> ServingExplorer:
    """Build the serving view (display the returned object in a notebook); keyword arguments
    as :class:`ServingExplorer`."""
    return ServingExplorer(**kwargs)


__all__ = ["ServingExplorer", "build_serving_explorer"]
