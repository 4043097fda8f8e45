"""Training on several GPUs of one server: data, tensor and pipeline parallelism (method.md 6).

It lives inside the model stage because a multi-GPU step is one more way to predict a model:
:func:`nslib.model.predict.predict_model` dispatches to it and the memory model shards with it.
"""
