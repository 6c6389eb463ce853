"""kvloop operator: kopf handlers and pure rendering functions, imported as kvloop.operator.

When Python runs with the repository root on sys.path (`python -m ...` or `python -c` from the
checkout), this folder would shadow the standard library's `operator`. In that case only, load the
real standard-library module in its place so that nothing breaks."""

if __name__ == "operator":
    import os as _os
    import sys as _sys
    from importlib.machinery import SourceFileLoader as _Loader
    from types import ModuleType as _ModuleType

    _stdlib_file = _os.path.join(_os.path.dirname(_os.__file__), "operator.py")
    _stdlib = _ModuleType("operator")
    _stdlib.__file__ = _stdlib_file
    _Loader("operator", _stdlib_file).exec_module(_stdlib)
    _sys.modules["operator"] = _stdlib
    globals().update({k: v for k, v in vars(_stdlib).items() if k not in ("__name__", "__file__")})
