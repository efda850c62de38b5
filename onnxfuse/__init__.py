"""onnxfuse: fuse Linear(+bias)+GELU blocks of ONNX models into one ``FusedLinearGelu`` node.

Public API:
    optimize(model)      rewrite a model (a path or an ``onnx.ModelProto``): ``(model, report)`` (``pipeline``)
    save(result, path)   write what ``optimize`` returned, atomically, external data streamed
    DOMAIN               the custom-op domain (``ai.onnxfuse``)
    DOMAIN_VERSION       the domain's opset version, for ``helper.make_opsetid(DOMAIN, DOMAIN_VERSION)``
    get_library_path()   path of the custom-op library to give ``SessionOptions.register_custom_ops_library``
    create_session()     an ``onnxruntime.InferenceSession`` with the library registered

``import onnxfuse`` stays cheap (the command line's ``--help`` and ``--version`` pay for it, and import
nothing but this package and click): ONNX, the rewriter and ONNX Runtime are imported on first use. The domain's
facts come from ``domain``, which registers the op schemas with ONNX, the first time one is asked for.
"""

from .version import __version__


def get_library_path() -> str:
    from .runtime import get_library_path as _get

    return _get()


def create_session(model, providers=None, **kwargs):
    from .runtime import create_session as _create

    return _create(model, providers=providers, **kwargs)


_FROM_PIPELINE = ("optimize", "save")
_FROM_DOMAIN = ("DOMAIN", "DOMAIN_VERSION", "OP_TYPE", "OP_VERSION")


def __getattr__(name: str):
    """``optimize`` and ``save`` are the pipeline's own functions (their signatures and docstrings), and the
    domain's facts ``domain``'s (which imports ONNX), imported the first time they are asked for."""
    if name in _FROM_PIPELINE:
        from . import pipeline

        return getattr(pipeline, name)
    if name in _FROM_DOMAIN:
        from . import domain

        return getattr(domain, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FROM_PIPELINE) | set(_FROM_DOMAIN))


__all__ = ["DOMAIN", "DOMAIN_VERSION", "OP_TYPE", "OP_VERSION", "get_library_path", "create_session", "optimize",
           "save", "__version__"]
