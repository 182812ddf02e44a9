"""bellis offers every public name of daisy 2.0.0 (issue 14 item 2).

``daisy_names.json`` is ``dir()`` of ``daisy``, ``daisy.v2``, ``daisy.v1_compat`` and
``daisy.logging`` as the daisy 2.0.0 wheel from PyPI has them, recorded once by
``tools/record_daisy_names.py``. Each name must be in ``dir()`` of the matching bellis
module, unless it is listed below with the reason.
"""

from __future__ import annotations

import importlib
import json
import types
from pathlib import Path

import pytest

import bellis
from bellis.errors import BellisDeprecationWarning

FIXTURE = json.loads((Path(__file__).with_name("daisy_names.json")).read_text())
COUNTERPARTS = {
    "daisy": "bellis",
    "daisy.v2": "bellis.v2",
    "daisy.v1_compat": "bellis.v1_compat",
    "daisy.logging": "bellis.logging",
}
_OWN_IMPORT = "a module or name daisy imports for its own use (not part of its API)"
# (daisy module, name) -> why bellis does not offer it
NOT_OFFERED = {
    ("daisy.v2", "PackageNotFoundError"): _OWN_IMPORT + ": reads its version",
    ("daisy.v1_compat", "warnings"): _OWN_IMPORT,
    ("daisy.logging", "Path"): _OWN_IMPORT,
    ("daisy.logging", "annotations"): "`from __future__ import annotations`, not API",
    ("daisy.logging", "re"): _OWN_IMPORT,
    ("daisy.logging", "sys"): _OWN_IMPORT,
    ("daisy.logging", "threading"): _OWN_IMPORT,
    ("daisy.logging", "typing"): _OWN_IMPORT,
}


def test_the_fixture_is_daisy_2_0_0() -> None:
    assert FIXTURE["daisy_version"] == "2.0.0"
    assert set(FIXTURE["modules"]) == set(COUNTERPARTS)
    # the names the issue names explicitly are in it
    assert {"set_done_marker_basedir", "get_done_marker_basedir", "__version__"} <= set(
        FIXTURE["modules"]["daisy.v2"]
    )
    assert {"LOG_BASEDIR", "close_all_log_files", "current_slot_files", "logger"} <= set(
        FIXTURE["modules"]["daisy.logging"]
    )


@pytest.mark.parametrize("daisy_module", sorted(COUNTERPARTS))
def test_every_daisy_name_is_offered(daisy_module: str) -> None:
    module = importlib.import_module(COUNTERPARTS[daisy_module])
    offered = set(dir(module))
    missing = []
    for name, what in sorted(FIXTURE["modules"][daisy_module].items()):
        if (daisy_module, name) in NOT_OFFERED:
            continue
        if name not in offered:
            missing.append(name)
            continue
        value = getattr(module, name)
        if what["kind"] == "module":
            assert isinstance(value, types.ModuleType), name
        elif what["kind"] in ("class", "function"):
            assert callable(value), name
    assert not missing, f"{COUNTERPARTS[daisy_module]} lacks daisy's {missing}"


def test_exceptions_name_real_daisy_names() -> None:
    for daisy_module, name in NOT_OFFERED:
        assert name in FIXTURE["modules"][daisy_module], (daisy_module, name)


@pytest.mark.parametrize("name", FIXTURE["submodules"])
def test_every_daisy_submodule_is_offered(name: str) -> None:
    module = importlib.import_module(f"bellis.{name}")
    assert module.__name__ == f"bellis.{name}" and getattr(bellis, name) is module


def test_v2_has_daisy_v2_s_done_marker_aliases_and_version(tmp_path: Path) -> None:
    import bellis.v2 as v2

    assert v2.__version__ == bellis.__version__
    assert isinstance(v2.__version__, str)
    for name in ("set_done_marker_basedir", "get_done_marker_basedir", "__version__"):
        assert name in v2.__all__, name
        assert getattr(v2, name) is getattr(bellis, name), name
    with pytest.warns(BellisDeprecationWarning, match="set_tracking_basedir"):
        v2.set_done_marker_basedir(tmp_path / "markers")
    assert v2.get_tracking_basedir() == tmp_path / "markers"
    with pytest.warns(BellisDeprecationWarning, match="get_tracking_basedir"):
        assert v2.get_done_marker_basedir() == tmp_path / "markers"
