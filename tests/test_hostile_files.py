"""Files arbiter reads, written by someone hostile: configs and manifests (YAML) and
cache entries. Each must end fast in a ConfigError (YAML) or a cache warning naming the
file and what is wrong; never a hang, unbounded memory, a RecursionError or a crash.

The corpus below is what the issue-14 audit found (alias bombs, deep nesting, FIFOs,
character devices, huge files) plus random YAML from hypothesis.
"""
from __future__ import annotations

import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arbiter
from arbiter import yamlsrc
from arbiter.errors import ConfigError
from arbiter.manifest import load_manifest


def laughs(levels: int = 9, width: int = 9) -> str:
    """The 'billion laughs' document: each level an anchor aliasing the one below
    ``width`` times (9 levels of 9: 387 million nodes expanded, from 0.5 KB)."""
    lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    lines.append(f"backends: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def nested(depth: int, flow: bool = True) -> str:
    if flow:
        return "backends: " + "[" * depth + "]" * depth + "\n"
    return "backends:\n" + "".join(" " * (2 * i) + "-\n" for i in range(1, depth))


# -- YAML that explodes when expanded or walked -----------------------------------------
@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_deep_nesting_is_a_config_error(tmp_path, depth):
    """5,000 nested lists gave a raw RecursionError, 100,000 killed the process
    (SIGSEGV in the C composer)."""
    path = tmp_path / "deep.yaml"
    path.write_text(nested(depth))
    with pytest.raises(ConfigError, match="nest") as info:
        arbiter.load_config(path)
    assert info.value.file == str(path) and info.value.line == 1


def test_deep_block_nesting_is_a_config_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text(nested(300, flow=False))
    with pytest.raises(ConfigError, match="nest"):
        arbiter.load_config(path)


def test_alias_bomb_is_a_config_error(tmp_path):
    """A 0.5 KB alias bomb ran past 60 s and 2.7 GB before."""
    path = tmp_path / "laughs.yaml"
    path.write_text(laughs())
    assert path.stat().st_size < 600
    with pytest.raises(ConfigError, match="alias") as info:
        arbiter.load_config(path)
    assert info.value.file == str(path)


def test_modest_aliases_still_work(tmp_path):
    """Anchors and aliases that expand to a sane size are ordinary YAML and stay valid."""
    path = tmp_path / "ok.yaml"
    path.write_text("x-opts: &opts {graph_optimization_level: basic}\n"
                    "backends:\n  - {name: onnxruntime, options: *opts}\n")
    with pytest.raises(ConfigError, match="x-opts"):  # the anchor's own key is unknown
        arbiter.load_config(path)
    located = yamlsrc.load_text("a: &a [1, 2, 3]\nb: [*a, *a, *a]\n")
    assert located.data["b"] == [[1, 2, 3]] * 3


def test_alias_bomb_in_a_manifest(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(laughs().replace("backends:", "ops:"))
    with pytest.raises(ConfigError, match="alias"):
        load_manifest(path, backend="m")


def test_limits_fit_the_shipped_manifests():
    """The bounds leave room: the biggest shipped manifest is far below each."""
    import importlib.resources

    root = importlib.resources.files("arbiter.capabilities")
    for entry in root.iterdir():
        if entry.name.endswith(".yaml"):
            text = entry.read_text()
            assert len(text.encode()) * 10 < yamlsrc.MAX_BYTES
            stats = yamlsrc.scan(text, entry.name)
            assert stats.nodes * 10 < yamlsrc.MAX_NODES and stats.depth * 4 < yamlsrc.MAX_DEPTH


# -- paths that are not regular files ---------------------------------------------------
def test_fifo_as_config_path(tmp_path):
    """A FIFO blocked the first read forever (nobody writes to it)."""
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file") as info:
        arbiter.load_config(fifo)
    assert "FIFO" in str(info.value)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_character_device_as_config_path(device):
    """/dev/zero grew memory without bound."""
    if not os.path.exists(device):
        pytest.skip(f"{device} does not exist here")
    with pytest.raises(ConfigError, match="not a regular file"):
        arbiter.load_config(device)


def test_symlink_to_a_device_as_config_path(tmp_path):
    link = tmp_path / "config.yaml"
    link.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="not a regular file"):
        arbiter.load_config(link)


def test_directory_as_config_path(tmp_path):
    d = tmp_path / "c.yaml"
    d.mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        arbiter.load_config(d)


def test_huge_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as fh:  # sparse: no disk used
        fh.truncate(yamlsrc.MAX_BYTES + 1)
    with pytest.raises(ConfigError, match="larger than"):
        arbiter.load_config(path)


def test_fifo_as_manifest(tmp_path):
    fifo = tmp_path / "m.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_manifest(fifo, backend="m")


def test_unreadable_bytes_name_the_file(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"backends: [\xff\xfe]\n")
    with pytest.raises(ConfigError, match="cannot read") as info:
        arbiter.load_config(path)
    assert info.value.file == str(path)


# -- random YAML: ConfigError or a config, nothing else ----------------------------------
_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                     st.text(max_size=8))
_docs = st.recursive(_scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=6), kids, max_size=4)),
    max_leaves=30)


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("hostile-yaml")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_docs)
def test_random_yaml_documents_give_config_errors_only(module_dir, doc):
    import yaml

    text = yaml.safe_dump({"backends": doc} if isinstance(doc, (list, str)) else doc)
    path = module_dir / "random.yaml"
    path.write_text(text)
    try:
        arbiter.load_config(path)
    except ConfigError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="[]{}:,-&*!|>'\"#? \n\tab01", max_size=200))
def test_random_yaml_text_gives_config_errors_only(text):
    try:
        yamlsrc.load_text(text)
    except ConfigError:
        pass


def test_is_regular_check_does_not_follow_into_fifo_with_o_nonblock(tmp_path):
    """The FIFO is opened without blocking (O_NONBLOCK) and refused on its fstat."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError):
        yamlsrc.read_regular(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
