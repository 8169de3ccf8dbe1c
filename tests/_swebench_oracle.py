"""The official ``swebench`` package's log parsers and grading, run in a virtual environment of
their own: the oracle ``builtin_envs.swe`` is compared with.

The virtual environment is ``tests/_oracles.py``'s ``SWEBENCH`` (``swebench==5.0.2`` without
its declared dependencies, plus ``unidiff``; ``AENV_SWEBENCH_ORACLE_PYTHON`` names another):
the parsers and grading need nothing else once ``swebench.harness``'s package module (which
imports docker, datasets and modal) is bypassed.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests._oracles import SWEBENCH, oracle_python

VERSION = SWEBENCH.no_deps[0].split("==")[1]

# Runs in the oracle's interpreter: reads cases (JSON) on stdin, prints what swebench says.
_DRIVER = r"""
import json, os, sys, types

import swebench

harness = types.ModuleType("swebench.harness")  # its __init__ imports docker, datasets, modal
harness.__path__ = [os.path.join(os.path.dirname(swebench.__file__), "harness")]
sys.modules["swebench.harness"] = harness

from swebench.harness import grading, log_parsers
from swebench.harness.constants import EvalType
from swebench.types import TestSpec

assert swebench.__version__ == sys.argv[1], swebench.__version__
answers = []
for case in json.load(sys.stdin):
    spec = TestSpec(
        instance_id=case["id"], image="", eval_script_list=[], repo="", version="",
        FAIL_TO_PASS=case["f2p"], PASS_TO_PASS=case["p2p"], log_parser=case["parser"],
        eval_type=case["eval_type"],
    )
    with open(case["log_path"]) as f:
        text = f.read()
    parsed = {
        name: log_parsers.PARSER_REGISTRY[name](text, spec) for name in case["parsers"]
    }
    statuses, found = grading.get_logs_eval(spec, case["log_path"])
    gold = {"FAIL_TO_PASS": case["f2p"], "PASS_TO_PASS": case["p2p"]}
    report = grading.get_eval_tests_report(
        statuses, gold, eval_type=EvalType(case["eval_type"])
    )
    prediction = {"instance_id": case["id"], "model_patch": case["patch"]}
    answers.append({
        "parsed": parsed,
        "statuses": statuses,
        "found": found,
        "report": report,
        "resolution": grading.get_resolution_status(report),
        "eval_report": grading.get_eval_report(spec, prediction, case["log_path"], True),
    })
json.dump(answers, sys.stdout)
"""


@dataclass
class Case:
    """A log and the instance it grades."""

    id: str
    log: str
    parser: str = "parse_log_pytest"
    f2p: Sequence[str] = ()
    p2p: Sequence[str] = ()
    eval_type: str = "pass_and_fail"
    patch: str | None = "diff"
    parsers: Sequence[str] = field(default_factory=lambda: ["parse_log_pytest"])


def oracle(cases: Sequence[Case]) -> list[dict[str, Any]]:
    """What swebench's parsers and grading say of each case (installing swebench if needed)."""
    python = oracle_python(SWEBENCH)
    with tempfile.TemporaryDirectory(prefix="swe-oracle-") as tmp:
        payload = []
        for n, case in enumerate(cases):
            path = Path(tmp) / f"{n}.log"
            path.write_bytes(case.log.encode("utf-8"))
            payload.append(
                {
                    "id": case.id,
                    "log_path": str(path),
                    "parser": case.parser,
                    "f2p": list(case.f2p),
                    "p2p": list(case.p2p),
                    "eval_type": case.eval_type,
                    "patch": case.patch,
                    "parsers": list(case.parsers),
                }
            )
        done = subprocess.run(
            [str(python), "-c", _DRIVER, VERSION],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    assert done.returncode == 0, done.stderr[-3000:]
    answers: list[dict[str, Any]] = json.loads(done.stdout)
    return answers


def ours(case: Case) -> dict[str, Any]:
    """What ``builtin_envs.swe`` says of the case, in the oracle's shape."""
    from builtin_envs.swe import grading
    from builtin_envs.swe.log_parsers import resolve_parser

    # the oracle reads the log as a text file: universal newlines
    text = case.log.replace("\r\n", "\n").replace("\r", "\n")
    parser = resolve_parser(case.parser)
    statuses, found = grading.logs_eval(text, parser)
    report = grading.eval_tests_report(statuses, case.f2p, case.p2p, case.eval_type)
    return {
        "parsed": {name: resolve_parser(name)(text) for name in case.parsers},
        "statuses": statuses,
        "found": found,
        "report": report,
        "resolution": grading.resolution_status(report).value,
        "eval_report": {
            case.id: grading.eval_report(
                text, parser, case.f2p, case.p2p, case.eval_type, patch=case.patch
            )
        },
    }
