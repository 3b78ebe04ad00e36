"""The layers of the call path: the core (public calls, planner, runtimes) imports no framework
adapter; the torch and JAX adapters import the core and register their hooks with it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import portable_softmax as ps
from portable_softmax import api

PACKAGE = Path(ps.__file__).resolve().parent
#: the core: what the adapters sit on
CORE = ("api", "_backward", "_probe", "_launch", "_cuda", "_hip", "planner", "planner_backward", "layout",
        "_arrays", "_dtypes", "reference", "_variants", "_scratch", "_launcher")
ADAPTERS = ("_torch_op", "_jax", "_jax_ffi")

# The package's __init__ imports the torch adapter; a stand-in package object with the same
# __path__ lets the core modules be imported alone, as a program that never meets a framework
# array would load them.
_CORE_ALONE = f"""
import sys, types
package = types.ModuleType("portable_softmax")
package.__path__ = [{str(PACKAGE)!r}]
package.__version__ = "0"
sys.modules["portable_softmax"] = package
import importlib
for name in {CORE!r}:
    importlib.import_module("portable_softmax." + name)
"""


def _run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _CORE_ALONE + code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def _loaded_adapters() -> str:
    return ("print(','.join(sorted(m.split('.')[-1] for m in sys.modules if m.split('.')[-1] in "
            f"{ADAPTERS!r} and m.startswith('portable_softmax.'))) or '-')\n")


def test_importing_the_core_imports_no_adapter():
    assert _run(_loaded_adapters()) == ["-"]


def test_numpy_calls_through_the_core_load_no_adapter():
    code = ("import numpy as np\n"
            "from portable_softmax import api, _backward\n"
            "y = api.softmax(np.array([[0.0, 0.0]]))\n"
            "dx = _backward.softmax_backward(np.array([[1.0, 0.0]]), y)\n"
            "print(y.tolist() == [[0.5, 0.5]], dx.tolist() == [[0.25, -0.25]])\n" + _loaded_adapters())
    assert _run(code) == ["True", "True", "-"]


def _imported_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):  # function bodies too: a lazy import is an import
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names.update([module.split(".")[-1]] + [f"{module}.{a.name}".split(".")[-1] for a in node.names])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[-1] for a in node.names)
    return names


@pytest.mark.parametrize("module", CORE)
def test_no_core_module_imports_an_adapter(module):
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    assert not _imported_names(tree) & set(ADAPTERS), f"{module} imports a framework adapter"


def test_the_adapters_import_the_core():
    for module in ("_torch_op", "_jax"):
        assert "api" in _imported_names(ast.parse((PACKAGE / f"{module}.py").read_text())), module


def test_the_package_registers_the_torch_adapter_on_import():
    from portable_softmax import _torch_op

    assert api._torch_route is _torch_op.route and api._torch_call is _torch_op.call


def test_a_torch_tensor_loads_the_torch_adapter_and_gets_its_gradient():
    pytest.importorskip("torch", reason="torch is not installed")
    code = ("import torch\n"
            "from portable_softmax import api\n"
            "x = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)\n"
            "y = api.softmax(x)\n"
            "(y[0, 2]).backward()\n"
            "expected = torch.softmax(x.detach(), -1)\n"
            "grad = expected[0, 2] * (torch.eye(3)[2] - expected[0])\n"
            "print(type(y.grad_fn).__name__, torch.allclose(x.grad[0], grad))\n" + _loaded_adapters())
    name, close, loaded = _run(code)
    assert name.startswith("PortableSoftmax") and close == "True", (name, close)
    assert loaded == "_torch_op"


def test_a_traced_jax_array_loads_the_jax_adapter():
    pytest.importorskip("jax", reason="jax is not installed")
    code = ("import jax, jax.numpy as jnp\n"
            "from portable_softmax import api\n"
            "f = jax.jit(lambda a: api.log_softmax(a))\n"
            "y = f(jnp.array([0.0, 0.0]))\n"
            "print(type(y).__module__.split('.')[0], bool(jnp.allclose(y, jnp.log(0.5))))\n" + _loaded_adapters())
    assert _run(code) == ["jaxlib", "True", "_jax,_jax_ffi"]
