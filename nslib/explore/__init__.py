"""Stage 6, exploring: what-if questions about GPUs and models as plain functions, and the
ipywidgets explorer over them.

- :mod:`nslib.explore.gpus`: the explorer's GPUs and hypothetical ones (datasheet edits);
- :mod:`nslib.explore.pasted`: HuggingFace configs pasted as text;
- :mod:`nslib.explore.ranges`: what the predictors were trained on, and warnings beyond it;
- :mod:`nslib.explore.memory`: will the step fit on each GPU;
- :mod:`nslib.explore.whatif`: scenarios (one model on several GPUs) and their comparisons;
- :mod:`nslib.explore.parallel`: a training step against the parallel degree and the link;
- :mod:`nslib.explore.plots`: a scenario's figure;
- :mod:`nslib.explore.ui`: the ipywidgets explorer.
"""
