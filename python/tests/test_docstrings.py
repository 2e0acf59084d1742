"""Shapes, layouts and dtypes are written once, in kdalab/_core.pyi: every docstring there is also
the run-time docstring of the function or class (help()), and every public function has one."""
import ast
import inspect
import pathlib

import kdalab
from kdalab import _core

PYI = pathlib.Path(kdalab.__file__).with_name("_core.pyi")


def stub_docs():
    tree = ast.parse(PYI.read_text(encoding="utf-8"))
    docs = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node):
            docs[node.name] = ast.get_docstring(node)
        if isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and ast.get_docstring(m):
                    docs[f"{node.name}.{m.name}"] = ast.get_docstring(m)
    return docs


def test_every_stub_docstring_is_the_run_time_docstring():
    docs = stub_docs()
    assert "kda_recurrent" in docs and "Rng.normal" in docs
    for name, text in docs.items():
        if name == "Error":  # the exception type's own docstring is nanobind's
            continue
        if name.startswith("cuda_") and not _core.built_with_cuda:  # CUDA builds only
            continue
        obj = _core
        for part in name.split("."):
            obj = getattr(obj, part)
        assert text in (obj.__doc__ or ""), name


def test_every_public_function_has_a_stub_docstring():
    docs = stub_docs()
    funcs = [n for n, o in vars(_core).items() if not n.startswith("_") and callable(o) and not inspect.isclass(o)]
    missing = [n for n in funcs if n not in docs]
    assert not missing, missing
