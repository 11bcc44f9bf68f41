"""Zoo models with every dim static (the example batch, 2), for ``tvm --tune``: TVM 0.27's
MetaSchedule tunes only static-shape functions. Spec: ``bench/static_zoo.py:cnn``."""

from exporter.model.zoo import ZOO


def _static(name: str):
    module, args, _dynamic = ZOO[name]()
    return module, args


def mlp():
    return _static("mlp")


def cnn():
    return _static("cnn")


def encoder():
    return _static("encoder")


def decoder():
    return _static("decoder")
