"""The shipped type stubs match the built native module: no name, method or parameter in
`_native.pyi` that the module lacks, and none in the module that the stubs lack."""

from __future__ import annotations

import ast
import inspect
from importlib import resources

import intercept
from intercept import _native

# Classes only a `testing` build registers.
TESTING_ONLY = {"NativeMock", "NativeBoreServer"}


def _stub() -> ast.Module:
    text = (resources.files("intercept") / "_native.pyi").read_text()
    return ast.parse(text)


def _params(fn: ast.FunctionDef) -> list[str]:
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
    return [n for n in names if n not in ("self", "cls")]


def _runtime_params(obj: object) -> list[str] | None:
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return [p for p in sig.parameters if p not in ("self", "cls", "$self", "$cls")]


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


def test_the_package_ships_its_stubs_and_py_typed() -> None:
    files = resources.files("intercept")
    assert (files / "py.typed").is_file()
    assert (files / "_native.pyi").is_file()
    assert intercept.__version__ == _native.__version__


def test_module_names_match() -> None:
    stub = _stub()
    declared = set()
    for node in stub.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
    present = {n for n in dir(_native) if not n.startswith("_")} | {"__version__"}
    if not _native.TESTING:
        declared -= TESTING_ONLY
    assert declared == present, (
        f"only in the stubs: {sorted(declared - present)}; "
        f"only in the module: {sorted(present - declared)}"
    )


def test_functions_take_the_stubbed_parameters() -> None:
    checked = 0
    for node in _stub().body:
        if isinstance(node, ast.FunctionDef):
            runtime = _runtime_params(getattr(_native, node.name))
            assert runtime is not None, f"{node.name} has no signature"
            assert runtime == _params(node), node.name
            checked += 1
    assert checked == 3


def test_classes_match_method_by_method() -> None:
    checked = 0
    for node in _stub().body:
        if not isinstance(node, ast.ClassDef):
            continue
        if node.name in TESTING_ONLY and not _native.TESTING:
            continue
        cls = getattr(_native, node.name)
        stubbed = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
        members = {
            n for n, v in vars(cls).items() if not n.startswith("_") or n == "__call__"
        }
        declared = set(stubbed) - {"__new__"}
        assert declared == members, (
            f"{node.name}: only in the stubs: {sorted(declared - members)}; "
            f"only in the module: {sorted(members - declared)}"
        )
        for name, fn in stubbed.items():
            if name == "__new__":
                # The constructor's signature is the class's.
                runtime = _runtime_params(cls)
                assert runtime == _params(fn), f"{node.name}()"
                checked += 1
                continue
            member = vars(cls)[name]
            if _is_property(fn):
                assert inspect.isdatadescriptor(member), f"{node.name}.{name} is a property"
                continue
            assert not inspect.isdatadescriptor(member), f"{node.name}.{name} is a method"
            if name.startswith("__"):
                # A slot (`__call__`): CPython reports it as `(*args, **kwargs)`.
                assert callable(member), f"{node.name}.{name}"
                continue
            runtime = _runtime_params(getattr(cls, name))
            assert runtime is not None, f"{node.name}.{name} has no signature"
            assert runtime == _params(fn), f"{node.name}.{name}"
            checked += 1
    assert checked >= 30, checked
