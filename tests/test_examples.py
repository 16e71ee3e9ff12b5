"""Every script in ``examples/`` runs to the end, says on stderr what it is doing, and ends with what the
decoder did and why.

Each runs as a user would run it (``python examples/NAME.py``, in a fresh process), with a short
output (the scripts take max new tokens as their one optional argument), on the bundled SmolLM2: a few
seconds to load the model from its converted copy in the session's cache folder (the first load of a
session converts it, 20-60 s), plus a few seconds of decoding per script. No assertion depends on
timing: what the budget chose, and so the explanation's second sentence, depends on the machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = ["quickstart.py", "pipeline_flag.py", "streaming.py", "sampling.py"]
# the first sentence of DecodeStats.explain()
EXPLAINED = re.compile(r"\d+ tokens in \d+ model calls \(\d+\.\d\d tokens per call; plain generate makes one "
                       r"call per token\)\. \S")


@pytest.fixture(scope="module")
def smollm_installed():
    from lookahead.tools.models import smollm2_location

    try:
        smollm2_location()
    except RuntimeError as err:
        pytest.skip(f"SmolLM2 not installed ({err}); the set-up script `bash .ci/install test` installs it")


@pytest.mark.smollm
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_and_explains(smollm_installed, name):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), "24"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert EXPLAINED.search(proc.stdout), f"{name} printed no explanation:\n{proc.stdout[-2000:]}"
    last = proc.stdout.splitlines()[-1].removeprefix("sampled: ")
    assert EXPLAINED.match(last), proc.stdout[-2000:]  # the explanation is the last line
    first = proc.stderr.splitlines()[0]  # said before the model's load, the first long phase
    assert first.startswith(("loading SmolLM2-135M-Instruct", "loaded SmolLM2-135M-Instruct",
                             "the machine looks busy")), proc.stderr[:2000]
    assert re.search(r"(?m)^loaded SmolLM2-135M-Instruct .*in \d+\.\d s", proc.stderr), proc.stderr[:2000]
    if name in ("quickstart.py", "pipeline_flag.py"):  # greedy: the plain text, token for token
        assert re.search(r"same text as plain( generate)?: True", proc.stdout), proc.stdout[-2000:]
    if name == "streaming.py":
        assert re.search(r"\d+ chunks for \d+ tokens in \d+ model calls", proc.stdout), proc.stdout[-2000:]
