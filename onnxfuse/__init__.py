"""onnxfuse: fuse Linear(+bias)+GELU blocks of ONNX models into one ``FusedLinearGelu`` node.

Public API:
    DOMAIN               the custom-op domain (``ai.onnxfuse``)
    DOMAIN_VERSION       the domain's opset version, for ``helper.make_opsetid(DOMAIN, DOMAIN_VERSION)``
    get_library_path()   path of the custom-op library to give ``SessionOptions.register_custom_ops_library``
    create_session()     an ``onnxruntime.InferenceSession`` with the library registered
"""

from .domain import DOMAIN, DOMAIN_VERSION, OP_TYPE, OP_VERSION

__version__ = "0.1.0"


def get_library_path() -> str:
    from .runtime import get_library_path as _get

    return _get()


def create_session(model, providers=None, **kwargs):
    from .runtime import create_session as _create

    return _create(model, providers=providers, **kwargs)


__all__ = ["DOMAIN", "DOMAIN_VERSION", "OP_TYPE", "OP_VERSION", "get_library_path", "create_session", "__version__"]
