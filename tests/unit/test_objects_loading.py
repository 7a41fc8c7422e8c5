"""Manifest loading (dracommon.yamlload, controller.objects): the fast YAML path gives exactly
`yaml.safe_load_all`'s documents and errors (PyYAML's pure SafeLoader is the reference: it is
what the tools always used), on generated documents, hand-picked edge cases, and every YAML
file of the repository."""

from __future__ import annotations

import argparse
import datetime
import gc
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import fleet
from controller.objects import ClusterObjects, ManifestError, gc_paused, load_manifests
from controller.options import with_objects
from dracommon import yamlload

REPO = Path(__file__).resolve().parents[2]


def typed(value: Any) -> Any:
    """The value with every scalar's type beside it: 1, 1.0 and True are equal in Python."""
    if isinstance(value, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    return (type(value).__name__, repr(value))


def reference(text: str) -> Any:
    """What PyYAML's pure SafeLoader makes of `text`: the documents, or the error's text."""
    try:
        return typed(list(yaml.load_all(text, Loader=yaml.SafeLoader)))
    except yaml.YAMLError as err:
        return ("error", type(err).__name__, str(err))


def ours(text: str) -> Any:
    try:
        return typed(yamlload.load_all(text))
    except yaml.YAMLError as err:
        return ("error", type(err).__name__, str(err))


# Scalars whose plain spelling PyYAML resolves to another type, or that need quoting.
TRICKY = [
    "yes", "No", "on", "~", "null", "", " ", "0012", "0o17", "0x1F", "1_000", "1:20", "-1", "+1", ".5",
    "1e3", "1.0e+3", ".inf", "-.Inf", ".nan", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "=", "<<",
    "- x", "-", "?", ": x", "a: b", "a:b", "#x", "x #y", "x#y", "'q'", '"q"', "it's", "[1]", "{a: 1}",
    "&a", "*a", "!tag", "|", ">", "%x", "@x", "`x", ",x", " lead", "trail ", "a\nb", "tab\there",
    "ünïcode", "\u2028", "\x85", "pci0000:17", "0000:18:00.0", "580.65.06", "81559Mi", "9.0.0",
]  # fmt: skip
scalars = st.one_of(
    st.sampled_from(TRICKY),
    st.text(max_size=12),
    st.text(alphabet="ab :-#'\"./", max_size=100),  # long ones wrap at the dump width
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.dates(),
)
keys = st.one_of(st.sampled_from(TRICKY), st.text(alphabet="abc./-_:", min_size=1, max_size=8), st.integers())
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(documents, min_size=1, max_size=3),
    st.sampled_from([2, 4]),
    st.sampled_from([20, 80, 10_000]),
    st.booleans(),
)
def test_dumped_documents_load_as_pyyaml_loads_them(
    docs: list[Any], indent: int, width: int, sort: bool
) -> None:
    text = yaml.safe_dump_all(docs, indent=indent, width=width, sort_keys=sort, allow_unicode=True)
    assert ours(text) == reference(text)


EDGE_CASES = [
    "", "# only a comment\n", "---\n", "a: 1\n---\n", "# c\n---\na: 1\n", "---\n---\na: 1\n", "a: 1\n...\n",
    "a: =\n", "a:\t1\n", "a: 1 \t\n", "a: b\x85c: d\n", "\ufeffa: 1\n", "a: b\r\nc: d\r\n",
    "%YAML 1.1\n---\na: 1\n",
    "a: 1\na: 2\n", "<<: {a: 1}\nb: 2\n", "a: &x 1\nb: *x\n", "? a\n: b\n", "a: !!str 1\n", "a: |\n  x\n",
    "a: >-\n  x\n  y\n", "a: [1, 2]\n", "a: {}\nb: []\n", "- - a\n  - b\n", "a:\n- 1\nb:\n  - 2\n",
    "a: 'it''s'\n", "a: 'it's'\n", 'a: "x\\ty"\n', 'a: "x y"\n', "a:    b   \n", "a: b # comment\n",
    "a: # comment\n  b: 1\n", "a: 1\n  b: 2\n", "a:\n  b: 1\n - c\n", "- a: 1\n b: 2\n", "- a: 1\n  - b\n",
    "a: long\n  continued\n", "a: 'long\n  continued'\n", "a:\n\n  b: 1\n", "1: one\ntrue: yes\n~: null\n",
    "'a': 1\n\"b\": 2\n'c''d': 3\n", "'a'b: 1\n", "a: b: c\n", "a: b:\n", "a:b\n", "-\n- x\n-  y\n",
    "- \n  a: 1\n", "key: [unclosed\n", "a: 'unclosed\n", "\x00\n", "a: \x07\n", "k" * 1100 + ": v\n",
    "--- x\n", "---x: 1\n", "----\n", "a:\n  - b:\n    - c\n", "a:\n    - 1\n    - 2\n", "-1: x\n",
    ": b\n", "a: 1\n: b\n", "- : b\n",
    # Plain scalars continued on more indented lines (yaml.safe_dump wraps long ones).
    "a: b\n  c\n", "a: b\n c\n  d\ne: f\n", "a: b\n\n  c\n", "a: b\n\n\n  c\n", "a: b\n  # c\n",
    "a: b\n  c # d\n", "a: b\n  c: d\n", "a: b\n  c:\n", "a: b\n  - c\n", "- b\n  c\n", "a:\n- b\n c\n",
    "a:\n  - b\n   c\n", "a:\n  - b\n  c\n", "- a: b\n   c\n", "- a: b\n  c\n", "a: 'b'\n  c\n",
    "a: b\n  'c'\n", "a: it's\n  \"q\"\n", "a: x\\y\n  z\n", "a: 1\n  2\n", "a: 2001-12-14\n  21:59:43.10\n",
    "a: yes\n  no\n", "a: .5\n  e\n", "a: [b\n  c]\n", "a: b\n  ---\n", "a: b\n  ...\n", "'a': b\n  c\n",
    "a b\n  c: d\n", "a: b\n  c\n  d\n    e\n f\n", "a:\n  b: c\n    d\n  e: f\n", "a: b\n  c\n\nd: e\n",
    "a: -\n  b\n", "a: b\n  #c\n  d\n", "a: b\n  c  \n  d\n", "a: b\n  c\n---\nd: e\n    f\n",
]  # fmt: skip


@pytest.mark.parametrize("text", EDGE_CASES)
def test_edge_cases_load_or_fail_as_pyyaml(text: str) -> None:
    assert ours(text) == reference(text)


def through_json(text: str) -> Any:
    """What path 1's JSON route makes of `text`: the documents, or that it leaves the text to
    the tree builder (a key or value JSON does not carry) or to PyYAML (outside the subset)."""
    try:
        return typed(yamlload._load_as_json(text))
    except yamlload._NotJson:
        return "not JSON"
    except yamlload._NotSubset:
        return "not the subset"


def through_tree(text: str) -> Any:
    try:
        return typed(yamlload._load_subset(text))
    except yamlload._NotSubset:
        return "not the subset"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(documents, min_size=1, max_size=3), st.sampled_from([2, 4]), st.sampled_from([20, 10_000]))
def test_the_json_route_takes_what_the_tree_builder_takes(docs: list[Any], indent: int, width: int) -> None:
    text = yaml.safe_dump_all(docs, indent=indent, width=width, allow_unicode=True)
    routed = through_json(text)
    if routed != "not JSON":  # else dates or keys not strings: the tree builder's, or PyYAML's
        assert routed == through_tree(text)
    if routed not in ("not JSON", "not the subset"):
        assert routed == reference(text)


@pytest.mark.parametrize("text", EDGE_CASES)
def test_edge_cases_through_the_json_route(text: str) -> None:
    routed = through_json(text)
    if routed != "not JSON":
        assert routed == through_tree(text)
        if routed != "not the subset":
            assert routed == reference(text)


LEARNED_VALUES = [
    "1", "yes", "~", "null", "2001-12-14", "'q'", '"q"', "'it''s'", "[]", "{}", "[1]", "{a: 1}", "a: b",
    "x #y", "#c", "- x", "0012", ".inf", "-.nan", "1:20", "é", "b:", "=", "<<", "&a", "*a", "!t", "|", ">",
    "'open",
]  # fmt: skip


@pytest.mark.parametrize("value", LEARNED_VALUES)
def test_a_known_key_with_a_new_value_reads_as_pyyaml_reads_it(value: str) -> None:
    # The second item teaches the route the text before the value in that state; the third
    # only brings a new value, read from what was learned.
    text = f"- k: a\n- k: b\n- k: {value}\n"
    assert ours(text) == reference(text)
    routed = through_json(text)
    if routed != "not JSON":
        assert routed == through_tree(text)


def test_fleet_files_take_the_json_route(tmp_path: Path) -> None:
    # bench.fleet's files, as `draplugin devices` renders slices (MIG nodes too), one per node.
    written = fleet.write_fleet(tmp_path, nodes=6, gpus_per_node=8, mig_fraction=0.5, fmt="yaml")
    slices = [path for path in written.paths if path.parent.name == "slices"]
    assert len(slices) == 6
    for path in slices:
        text = path.read_text(encoding="utf-8")
        expected = list(yaml.load_all(text, Loader=yaml.SafeLoader))
        assert yamlload._load_as_json(text) == expected
        assert yamlload._load_as_json(text) == expected  # again, from the steps kept for its lines
        assert yamlload._load_as_json(text.replace("\n", "  \n")) == expected  # trailing spaces


def _replays(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of each run `_load_as_json` replays from here on."""
    replayed: list[int] = []
    replay = yamlload._replay

    def counted(lines: list[str], at: int, table: Any) -> Any:
        run = replay(lines, at, table)
        if run is not None:
            replayed.append(len(run[0]))
        return run

    monkeypatch.setattr(yamlload, "_replay", counted)
    return replayed


def test_files_of_one_shape_replay_runs_of_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    # After a few nodes' files, a node's file is mostly replayed: a stretch of lines between
    # two lines seen once (its GPUs' UUIDs) is one list comparison.
    # What earlier tests kept does not count: their runs, and their steps against the limit
    # past which lines are no longer kept (then every line seen twice is learned again).
    monkeypatch.setattr(yamlload, "_runs", {})
    monkeypatch.setattr(yamlload, "_runs_kept", 0)
    monkeypatch.setattr(yamlload, "_steps_kept", 0)
    # Nodes no other test renders: their lines seen once (UUIDs, names) are new here too.
    alike = [n for n in range(7000, 7100) if fleet.node_model(n) == fleet.node_model(7000)][:6]
    texts = [yaml.safe_dump_all(fleet.node_slices(n, 8), sort_keys=False) for n in alike]
    for text in texts[:4]:  # the first learns its lines, the next keep the stretches as runs
        yamlload._load_as_json(text)
    replayed = _replays(monkeypatch)
    for text in texts[4:]:
        assert yamlload._load_as_json(text) == list(yaml.load_all(text, Loader=yaml.SafeLoader))
    assert len(texts) == 6
    assert sum(replayed) > 0.8 * sum(text.count("\n") for text in texts[4:])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(0, 40), st.integers(1, 4), st.booleans(), st.integers(0, 7), st.sampled_from(TRICKY)
        ),
        min_size=2,
        max_size=8,
    )
)
def test_runs_replay_only_the_same_lines(shapes: list[tuple[int, int, bool, int, str]]) -> None:
    # Files that start alike and go on differently (another model, GPU count, MIG layout, one
    # value changed somewhere): each reads as PyYAML reads it, whatever runs earlier ones left.
    for index, gpus, mig, changed, value in shapes:
        slices = fleet.node_slices(index, gpus, mig=mig)
        devices = slices[0]["spec"]["devices"]
        devices[changed % len(devices)]["attributes"]["index"] = {"string": value}
        text = yaml.safe_dump_all(slices, sort_keys=False)
        assert ours(text) == reference(text)


def test_what_json_cannot_carry_goes_to_the_tree_builder() -> None:
    for text in ("when: 2001-12-14\n", "1: one\n", "a:\n  true: x\n"):
        with pytest.raises(yamlload._NotJson):
            yamlload._load_as_json(text)
        assert ours(text) == reference(text)


@pytest.mark.parametrize("loader", ["libyaml", "pure"])
def test_every_yaml_file_of_the_repository(monkeypatch: pytest.MonkeyPatch, loader: str) -> None:
    if loader == "pure":
        monkeypatch.setattr(yamlload, "c_loader", lambda: None)  # a PyYAML wheel without libyaml
    listed = subprocess.run(
        ["git", "ls-files", "*.yaml", "*.yml"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(listed) > 20
    for name in listed:
        text = (REPO / name).read_text(encoding="utf-8")
        if "{{" in text:
            continue  # Helm templates are not YAML until rendered
        assert ours(text) == reference(text), name


def test_the_venv_pyyaml_has_libyaml() -> None:
    # Path 2 is only fast with libyaml: the wheels the project installs ship it.
    assert yaml.__with_libyaml__ and yamlload.c_loader() is yaml.CSafeLoader


def test_the_resolver_patterns_are_pyyamls() -> None:
    # The copy in yamlload (so that it need not import PyYAML): each first character's
    # (tag, pattern) list as PyYAML's Resolver keeps it, in the same order; none for any character.
    theirs = {
        first: [(tag, pattern.pattern, pattern.flags) for tag, pattern in entries]
        for first, entries in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
        if first  # "" (the empty scalar, null): the subset refuses an empty plain scalar before
    }
    mine = {
        first: [(tag, pattern.pattern, pattern.flags) for tag, pattern in entries]
        for first, entries in yamlload._implicit().items()
    }
    assert mine == theirs
    assert frozenset(theirs) == yamlload._IMPLICIT_FIRSTS


PLAIN_SCALARS = st.one_of(
    st.sampled_from(TRICKY),
    st.text(alphabet="0123456789+-._:eExXbBoO", min_size=1, max_size=12),  # numbers, odd ones too
    st.text(alphabet="yYnNtTfFoOeEsSuUlLrRaA~", min_size=1, max_size=6),  # booleans and nulls
    st.text(alphabet="0123456789-:tT .Z+", min_size=1, max_size=30),  # timestamps
    st.text(min_size=1, max_size=12),
)


@settings(max_examples=3000, deadline=None)
@given(PLAIN_SCALARS)
def test_plain_scalars_resolve_and_construct_as_pyyaml_does(text: str) -> None:
    # yamlload's own resolution (strings, null, booleans and decimal ints made without PyYAML)
    # beside PyYAML's resolver and SafeConstructor, on every plain scalar the subset takes.
    try:
        value = yamlload._plain(text)
    except yamlload._NotSubset:
        return
    tag = yaml.resolver.Resolver().resolve(yaml.nodes.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    expected = yaml.constructor.SafeConstructor().construct_object(yaml.nodes.ScalarNode(tag, text))
    assert typed(value) == typed(expected)
    assert yamlload._resolve(text) == tag


def test_a_manifest_on_the_fast_path_imports_no_pyyaml(tmp_path: Path) -> None:
    # PyYAML's import is a tenth of explain's start-up: the fleet's files (the DeviceClasses'
    # wrapped selectors too) and the usual scalars load without it.
    written = fleet.write_fleet(tmp_path, nodes=2, gpus_per_node=2, mig_fraction=0.5, fmt="yaml")
    (tmp_path / "more.yaml").write_text("a: yes\nb: ~\nc: -12\nd: '0012'\ne: 1.5\n", encoding="utf-8")
    code = (
        "import sys\n"
        "from controller.objects import load_manifests\n"
        "objects = load_manifests(sys.argv[1:])\n"
        "assert objects.device_classes and objects.slices, objects\n"
        "print(sorted(m for m in sys.modules if m == 'yaml' or m.startswith('yaml.')))\n"
    )
    paths = [str(p) for p in written.paths if p.suffix == ".yaml"]
    done = subprocess.run(
        [sys.executable, "-c", code, *paths], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_a_tab_never_depends_on_libyaml() -> None:
    # libyaml takes a tab as separation where PyYAML's scanner refuses it.
    assert list(yaml.load_all("a:\t1\n", Loader=yaml.CSafeLoader)) == [{"a": 1}]
    with pytest.raises(yaml.scanner.ScannerError, match="found character '\\\\t'"):
        yamlload.load_all("a:\t1\n")


def test_libyaml_errors_read_as_pyyaml_words_them() -> None:
    text = "k" * 1100 + ": v\n"  # libyaml: "... in this context"; PyYAML: "... here"
    with pytest.raises(yaml.YAMLError) as caught:
        yamlload.load_all(text)
    assert "mapping values are not allowed here" in str(caught.value)


def test_slices_draplugin_prints_take_the_fast_path() -> None:
    slices = fleet.node_slices(0, 8) + fleet.node_slices(1, 2, mig=True)
    text = yaml.safe_dump_all(slices, sort_keys=False)
    assert yamlload._load_subset(text) == slices
    stamps = {"when": datetime.date(2001, 12, 14), "count": 12, "octal": 10, "ratio": 0.5}
    assert yamlload._load_subset("when: 2001-12-14\ncount: 12\noctal: 012\nratio: .5\n") == [stamps]


def test_empty_collections_are_fresh_objects() -> None:
    first, second = yamlload.load_all("a: []\nb: {}\n---\na: []\nb: {}\n")
    first["a"].append(1)
    first["b"]["x"] = 1
    assert second == {"a": [], "b": {}}


def test_manifest_error_names_the_file_and_pyyaml_message(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("a: b: c\n")
    with pytest.raises(yaml.YAMLError) as expected:
        list(yaml.load_all(path.read_text(), Loader=yaml.SafeLoader))
    with pytest.raises(ManifestError) as caught:
        load_manifests([path])
    assert str(caught.value) == f"{path}: invalid YAML: {expected.value}"


def test_json_and_yaml_manifests_load_alike(tmp_path: Path) -> None:
    claims = fleet.whole_gpu_claims(2)
    as_yaml = fleet.write_fleet(tmp_path / "y", nodes=3, gpus_per_node=2, fmt="yaml", claims=claims)
    as_json = fleet.write_fleet(tmp_path / "j", nodes=3, gpus_per_node=2, fmt="json", claims=claims)
    assert load_manifests(as_yaml.paths) == load_manifests(as_json.paths)


def test_gc_is_paused_while_parsing_and_back_after(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: b: c\n")
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    with pytest.raises(ManifestError):
        load_manifests([bad])
    assert gc.isenabled()  # back on after a failed load too
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()


def test_what_is_parsed_goes_to_the_oldest_generation() -> None:
    # Left in the youngest, the collector's next pass would traverse every parsed object.
    with gc_paused():
        tree = {"spec": {"devices": [{"name": "gpu-0"}]}}
    assert any(obj is tree for obj in gc.get_objects(generation=2))
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_objects_frozen_before_a_load_stay_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_paused():
            pass
        assert gc.get_freeze_count() >= frozen > 0
    finally:
        gc.unfreeze()


def test_loaded_objects_are_frozen_for_the_command_only(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    @with_objects
    def handler(args: argparse.Namespace, objects: ClusterObjects) -> int:
        seen.append(gc.get_freeze_count())
        return 0

    monkeypatch.setattr("controller.options.load_objects", lambda args: ClusterObjects())
    assert handler(argparse.Namespace()) == 0
    assert seen[0] > 0 and gc.get_freeze_count() == 0


def test_the_ascii_check_refuses_what_the_whole_class_refuses() -> None:
    import re

    whole = re.compile(yamlload._NOT_SUBSET)
    edges = [0xD7FF, 0xD800, 0xDFFF, 0xE000, 0xFEFE, 0xFEFF, 0xFF00, 0xFFFD, 0xFFFE, 0x10000, 0x10FFFF]
    for point in [*range(0x3000), *edges]:
        text = f"a: b{chr(point)}c"
        assert yamlload._outside_subset(text) == (whole.search(text) is not None), hex(point)
