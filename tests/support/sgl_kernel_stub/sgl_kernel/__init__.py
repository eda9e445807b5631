"""A stand-in for ``sgl_kernel``, SGLang's CUDA-only kernel package, so that SGLang runs on a CPU.

SGLang imports ``sgl_kernel`` at module level on many paths, but with ``--device cpu --attention-backend
torch_native`` the text path runs on torch alone. Here every attribute of ``sgl_kernel`` is a function that
raises NotImplementedError; a submodule (``sgl_kernel.scalar_type``, ``sgl_kernel.kvcacheio``, ...) is
missing, as from a partial install, and SGLang falls back where it imports one inside ``try``. When
``$CACHECHECK_SGL_KERNEL_LOG`` names a file, each import, submodule import attempt (``missing``), attribute
lookup and call is appended to it as ``<kind> <name> <pid>``, so a test can prove that no kernel was called.

``tests/support/sglang_server.py`` puts the folder above this package on the server's ``PYTHONPATH``.
"""

import importlib.abc
import os
import sys
import types

STANDIN = True  # lets a test tell this package from the real one


def _record(kind, name):
    path = os.environ.get("CACHECHECK_SGL_KERNEL_LOG")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{kind} {name} {os.getpid()}\n")


def _function(qualname):
    def standin(*args, **kwargs):
        _record("call", qualname)
        raise NotImplementedError(f"{qualname}: sgl_kernel is a stand-in (tests/support/sgl_kernel_stub)")

    standin.__name__ = qualname.rsplit(".", 1)[-1]
    standin.__qualname__ = qualname
    return standin


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        qualname = f"{self.__name__}.{name}"
        _record("attr", qualname)
        value = _function(qualname)
        setattr(self, name, value)
        return value


class _Submodules(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        # records the attempt and finds nothing, so the import raises ModuleNotFoundError
        if fullname.startswith(__name__ + "."):
            _record("missing", fullname)


sys.modules[__name__].__class__ = _StandInModule
sys.meta_path.insert(0, _Submodules())
_record("import", __name__)
