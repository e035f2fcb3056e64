"""Queue YAML and the settings module (conveyor.worker.settings)."""

from __future__ import annotations

import dataclasses
import random
import sys
import textwrap
from pathlib import Path

import pytest

from conveyor.constants import SETTINGS_ENV
from conveyor.errors import ConfigError
from conveyor.tasks.registry import registry
from conveyor.worker import QueueConfig, Settings, load_queues, load_settings
from conveyor.worker.runtime import import_task_modules
from conveyor.worker.selectors import HighestPriorityFirst, ReducedLottery

# ndkale's format: a mapping of entries keyed by a label, each with every field
NDKALE_YAML = """\
default:
  name: default
  priority: 60
  batch_size: 10
  visibility_timeout_sec: 300
  long_poll_time_sec: 5
  num_iterations: 4

bulk:
  name: bulk-import
  priority: 20
  batch_size: 1
  visibility_timeout_sec: 900
  long_poll_time_sec: 1
  num_iterations: 1

urgent:
  name: urgent
  priority: 100
  batch_size: 8
  visibility_timeout_sec: 120.5
  long_poll_time_sec: 0
  num_iterations: 10
"""


def write(tmp_path: Path, text: str, name: str = "queues.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_ndkale_format_loads_highest_priority_first(tmp_path: Path) -> None:
    queues = load_queues(write(tmp_path, NDKALE_YAML))
    assert [q.name for q in queues] == ["urgent", "default", "bulk-import"]
    assert queues[1] == QueueConfig("default", 60, 10, 300.0, 5.0, 4)
    assert queues[0].visibility_timeout_sec == 120.5 and queues[0].long_poll_time_sec == 0.0
    assert isinstance(queues[2].visibility_timeout_sec, float)


def test_a_list_of_queues_and_defaults_for_missing_fields(tmp_path: Path) -> None:
    queues = load_queues(write(tmp_path, "- name: a\n  priority: 3\n- name: b\n"))
    assert queues == [QueueConfig("b"), QueueConfig("a", priority=3)]
    # ndkale's TaskQueue defaults, but for the batch size: left out, as many as the consumer may hold
    assert QueueConfig("b") == QueueConfig("b", 5, None, 600.0, 5.0, 2)


def test_the_key_names_a_queue_without_a_name_field(tmp_path: Path) -> None:
    assert load_queues(write(tmp_path, "reports:\n  priority: 9\n")) == [QueueConfig("reports", 9)]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("q:\n  name: q\n  visibility_timeout: 30\n", r"queue 'q': unknown field\(s\) \['visibility_timeout'\]"),
        ("q:\n  priority: high\n", r"queue 'q': field 'priority' must be an integer"),
        ("q:\n  priority: true\n", r"field 'priority'"),
        ("q:\n  batch_size: 0\n", r"queue 'q': field 'batch_size' must be an integer >= 1 \(or left out\), got 0"),
        ("q:\n  batch_size: 2.5\n", r"field 'batch_size'"),
        ("q:\n  visibility_timeout_sec: 0\n", r"field 'visibility_timeout_sec' must be a number of seconds > 0"),
        ("q:\n  visibility_timeout_sec: .inf\n", r"field 'visibility_timeout_sec'"),
        ("q:\n  long_poll_time_sec: -1\n", r"field 'long_poll_time_sec' must be a number of seconds >= 0"),
        ("q:\n  num_iterations: 0\n", r"queue 'q': field 'num_iterations'"),
        ("q:\n  name: ''\n", r"field 'name' must be a non-empty string"),
        ("q: 5\n", r"queue 'q': expected a mapping of fields, got int"),
        ("- priority: 5\n", r"field 'name' is required in a list"),
        ("a:\n  name: x\nb:\n  name: x\n", r"queue 'x' is configured twice"),
        ("", r"expected a mapping \(or list\) of queues, got NoneType"),
        ("{}\n", r"no queues configured"),
        ("just text\n", r"expected a mapping"),
        ("q: [unclosed\n", r"not valid YAML"),
    ],
)
def test_invalid_queue_files_name_the_file_queue_and_field(tmp_path: Path, text: str, match: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as ei:
        load_queues(path)
    assert str(ei.value).startswith(str(path))


def test_a_missing_queue_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the queue configuration"):
        load_queues(tmp_path / "absent.yaml")


def test_queue_config_is_checked_when_built_directly() -> None:
    with pytest.raises(ConfigError, match="queue 'x': field 'batch_size'"):
        QueueConfig("x", batch_size=-1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        QueueConfig("x").priority = 3  # type: ignore[misc]
    assert QueueConfig("parked", priority=0).priority == 0  # allowed: lotteries just skip it


# --- the settings module ------------------------------------------------------------------------
@pytest.fixture
def settings_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "site"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    return d


def module(settings_dir: Path, name: str, text: str) -> str:
    (settings_dir / f"{name}.py").write_text(textwrap.dedent(text))
    sys.modules.pop(name, None)
    return name


def test_defaults_when_no_settings_module_is_named() -> None:
    for env in ({}, {SETTINGS_ENV: ""}, {SETTINGS_ENV: "  "}):
        s = load_settings(env)
        assert s == Settings()
        assert s.queues() == [QueueConfig("default")]
        assert isinstance(s.selector(), ReducedLottery)


def test_settings_module_values_are_read(settings_dir: Path) -> None:
    write(settings_dir, NDKALE_YAML, "conveyor_queues.yaml")
    module(
        settings_dir,
        "site_tasks_mod",
        """\
        from conveyor import task

        @task(name="site.hello")
        def hello():
            return "hi"
    """,
    )
    name = module(
        settings_dir,
        "site_settings_a",
        """\
        STARTED = []
        QUEUE_CONFIG = "conveyor_queues.yaml"  # relative to this module's directory
        QUEUE_SELECTOR = "HighestPriorityFirst"
        TASK_MODULES = ["site_tasks_mod"]
        ON_WORKER_STARTUP = lambda: STARTED.append(1)
        SOMETHING_ELSE = 42  # the application's own setting: ignored
    """,
    )
    s = load_settings({SETTINGS_ENV: name})
    assert s.module == name and s.queue_config == settings_dir / "conveyor_queues.yaml"
    assert [q.name for q in s.queues()] == ["urgent", "default", "bulk-import"]
    sel = s.selector(random.Random(0))
    assert isinstance(sel, HighestPriorityFirst)
    assert sel.get_queue(s.queues(), {"bulk-import"}).name == "bulk-import"
    assert s.on_worker_shutdown is None and s.on_worker_startup is not None
    s.on_worker_startup()
    assert sys.modules[name].STARTED == [1]
    assert "site.hello" not in registry
    s.import_task_modules()
    try:
        assert registry.get("site.hello")() == "hi"
    finally:
        registry.unregister("site.hello")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("QUEUE_CONFIG = 5\n", "QUEUE_CONFIG must be a path or None"),
        ("QUEUE_SELECTOR = 'Fastest'\n", "unknown queue selector 'Fastest'"),
        ("QUEUE_SELECTOR = 3\n", "QUEUE_SELECTOR must be a name or a class"),
        ("TASK_MODULES = 'one.module'\n", "TASK_MODULES must be a list of module names"),
        ("ON_WORKER_STARTUP = 'not callable'\n", "ON_WORKER_STARTUP must be a callable or None"),
    ],
)
def test_invalid_settings_name_the_module_and_setting(settings_dir: Path, text: str, match: str) -> None:
    name = module(settings_dir, "site_settings_bad", text)
    with pytest.raises(ConfigError, match=match) as ei:
        load_settings({SETTINGS_ENV: name})
    assert "site_settings_bad" in str(ei.value)


def test_a_settings_module_that_cannot_be_imported_is_an_error() -> None:
    with pytest.raises(ConfigError, match=f"{SETTINGS_ENV}='no_such_settings_module': cannot import"):
        load_settings({SETTINGS_ENV: "no_such_settings_module"})


def test_task_modules_that_cannot_be_imported(settings_dir: Path) -> None:
    name = module(settings_dir, "site_settings_c", "TASK_MODULES = ['no_such_tasks_module']\n")
    with pytest.raises(ConfigError, match="TASK_MODULES: cannot import task module 'no_such_tasks_module'"):
        load_settings({SETTINGS_ENV: name}).import_task_modules()


def test_a_task_module_says_whether_it_or_what_it_imports_is_missing(settings_dir: Path) -> None:
    """Not found itself (or its package): the path hint.

    A dependency missing: named, and to be installed, with no path hint. A module of its own package
    missing, or its code raising: said so.
    """
    package = settings_dir / "site_pkg"
    package.mkdir()
    for name, text in [
        ("__init__", ""),
        ("needs_dep", "import conveyor_test_no_such_dependency\n"),
        ("needs_sibling", "import site_pkg.no_such_sibling\n"),
        ("raises", "raise RuntimeError('boom')\n"),
    ]:
        (package / f"{name}.py").write_text(text)
    for name in ("site_pkg.nothing", "no_such_site_pkg.tasks"):
        with pytest.raises(ConfigError, match=f"cannot import task module '{name}'.*PYTHONPATH"):
            import_task_modules([name])
    with pytest.raises(ConfigError) as e:
        import_task_modules(["site_pkg.needs_dep"])
    assert "task module 'site_pkg.needs_dep' imports 'conveyor_test_no_such_dependency', which is not found" in str(e.value)
    assert "install the package that provides 'conveyor_test_no_such_dependency'" in str(e.value)
    assert "PYTHONPATH" not in str(e.value) and isinstance(e.value.__cause__, ModuleNotFoundError)
    with pytest.raises(ConfigError, match=r"imports 'site_pkg\.no_such_sibling'.*a module of its own package 'site_pkg'"):
        import_task_modules(["site_pkg.needs_sibling"])
    with pytest.raises(ConfigError, match=r"task module 'site_pkg\.raises' \(.*raises\.py\) raised RuntimeError .*boom") as e:
        import_task_modules(["site_pkg.raises"])
    assert isinstance(e.value.__cause__, RuntimeError)


def test_a_missing_module_of_an_installed_package_is_not_a_package_to_install(settings_dir: Path) -> None:
    """A module missing from an installed package is said so, not taken for a package to install.

    `import json.no_such_module`: json is there, without that module (a wrong import, or another
    version): said so, not "install the package that provides 'json'".
    """
    name = module(settings_dir, "site_tasks_submodule", "import json.no_such_module\n")
    with pytest.raises(ConfigError) as e:
        import_task_modules([name])
    said = str(e.value)
    assert f"task module '{name}' imports 'json.no_such_module', which is not found" in said
    assert "'json' is installed (" in said and "but has no module 'json.no_such_module'" in said
    assert "install the package" not in said and "PYTHONPATH" not in said


def test_a_package_that_raises_is_run_once_to_say_so(settings_dir: Path) -> None:
    """The error of a task module whose package raised does not import the package again.

    Not even to say where the module is: its code, which may have side effects, runs once.
    """
    package = settings_dir / "site_pkg_raising"
    package.mkdir()
    runs = settings_dir / "runs"
    init = (
        f"import pathlib\np = pathlib.Path({str(runs)!r})\n"
        "p.write_text(p.read_text() + 'run')\nraise RuntimeError('no database')\n"
    )
    runs.write_text("")
    (package / "__init__.py").write_text(init)
    (package / "tasks.py").write_text("")
    with pytest.raises(ConfigError, match=r"task module 'site_pkg_raising\.tasks' raised RuntimeError .*no database"):
        import_task_modules(["site_pkg_raising.tasks"])
    assert runs.read_text() == "run"


def test_a_settings_module_that_raises_is_a_clear_error_naming_it(settings_dir: Path) -> None:
    name = module(settings_dir, "site_settings_raises", "raise RuntimeError('no database here')\n")
    with pytest.raises(ConfigError) as e:
        load_settings({SETTINGS_ENV: name})
    said = str(e.value)
    assert said.startswith(f"{SETTINGS_ENV}='{name}': settings module '{name}' (") and "site_settings_raises.py" in said
    assert "raised RuntimeError as it was imported: no database here" in said
    assert isinstance(e.value.__cause__, RuntimeError)


def test_settings_read_the_environment_by_default(settings_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = module(settings_dir, "site_settings_d", "QUEUE_SELECTOR = 'kale.queue_selector.Lottery'\n")
    monkeypatch.setenv(SETTINGS_ENV, name)
    assert load_settings().queue_selector == "kale.queue_selector.Lottery"
