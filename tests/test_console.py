"""What the command line and the examples show while they work (``lookahead/tools/console.py``): the library's
log lines on stderr, timed phases, and the thread count for a busy machine (decided from given figures)."""

from __future__ import annotations

import logging

import pytest
import torch

from lookahead.tools import console


@pytest.mark.parametrize("default, cores, load, threads", [
    (2, 2, 0.3, 2),     # quiet: torch's default
    (2, 2, 1.0, 1),     # one core busy: one thread, which never waits for a thread on the busy core
    (2, 2, 1.9, 1),     # both busy: still one
    (8, 16, 9.0, 7),    # the cores left
    (8, 16, 4.0, 8),    # enough cores left for the default
    (2, 2, None, 2),    # the system tells nothing: torch's default
])
def test_auto_threads(default, cores, load, threads):
    assert console.auto_threads(default, cores, load) == threads


def test_set_threads_takes_a_number_or_leaves_torch_alone():
    before = torch.get_num_threads()
    try:
        assert console.set_threads(1) == 1 and torch.get_num_threads() == 1
        assert console.set_threads(None) == 1  # torch's choice, untouched
    finally:
        torch.set_num_threads(before)


def test_auto_says_why_it_runs_fewer_threads(monkeypatch, caplog):
    before = torch.get_num_threads()
    monkeypatch.setattr(console, "busy_cores", lambda: 1.0)
    monkeypatch.setattr(console, "usable_cores", lambda: 2)
    try:
        torch.set_num_threads(2)
        with caplog.at_level(logging.INFO, logger="lookahead"):
            assert console.set_threads("auto") == 1
        assert "other work keeps 1.0 of 2 cores busy): torch runs on 1 thread instead of 2" in caplog.text
        assert "will be slow and noisy; --threads 1 suits it better" in console.contention_hint(2)
        monkeypatch.setattr(console, "busy_cores", lambda: 0.1)
        assert console.contention_hint(2) is None
    finally:
        torch.set_num_threads(before)


def test_busy_cores_is_a_count_of_cores_or_unknown():
    busy = console.busy_cores(interval=0.01)
    assert busy is None or 0.0 <= busy <= (__import__("os").cpu_count() or 1) + 1e-9


def test_library_lines_go_to_the_current_stderr_and_are_removed_after(capsys):
    log = logging.getLogger("lookahead")
    level, handlers = log.level, list(log.handlers)
    with console.logging_to_stderr():
        with console.phase("converting") as timing:
            pass
        logging.getLogger("lookahead").debug("not shown")
    err = capsys.readouterr().err
    assert err.startswith("converting ...\nconverting: ") and err.endswith(" s\n") and "not shown" not in err
    assert timing.seconds >= 0.0
    assert log.handlers == handlers and log.level == level  # put back
    handler = console.log_to_stderr()
    try:
        assert console.log_to_stderr() is handler  # once
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
