"""The package's version: one definition, which the package, its reports and ``onnxfuse --version`` give."""

__version__ = "0.2.0"
