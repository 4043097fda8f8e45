"""``nslib collect``: measure a GPU (or, in the tests, the CPU) in the layouts nslib reads.

Parts, each within its share of the time budget (:func:`collect`):

- ``fp32``: FP32 kernels of the NeuSight classes (:mod:`.fp32`) into the test-split CSVs;
- ``tensor``: BF16 GEMMs and attention (:mod:`.tensor16`) into aiconfigurator-layout tables;
- ``models``: whole-model steps (:mod:`.steps`) as labels;

plus the GPU's datasheet (:mod:`.sheet`) and ``provenance.json``. :mod:`.layout` says where each
file goes; :mod:`.sweep` is the budgeted loop, :mod:`.timing` the clock and profiler.
:func:`nslib.evaluation.collect.run.collect` runs a collection.
"""
