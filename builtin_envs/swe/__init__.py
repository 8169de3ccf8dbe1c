"""swe (SWE-bench tasks) as a library: rows, log parsers, grading, episodes.

:mod:`.grading` grades a test log as SWE-bench does (``RESOLVED_FULL``/``PARTIAL``/``NO`` and
the per-test report), with :mod:`.log_parsers`' parsers (pytest's, Django's, ...); :mod:`.rows`
reads SWE-bench rows from JSON or JSON-lines files and builds a row's evaluation script;
:mod:`.sandbox` runs the agent's commands out of sight of the dataset; :mod:`.strict` says which
of the agent's changes strict grading applies; :mod:`.episode` is one task: the repository at
its base commit, the tools, the grading; on Kubernetes, :mod:`.judge` is the pod's judge
container (the rows, the repositories, the grading) and :mod:`.pod` the runtime's side of it.
The environment project
``swe@1.0.0`` (``src/``) serves them; ``docs/builtins.md`` documents it. Usable without any
sandbox::

    from builtin_envs.swe import grading, log_parsers
    statuses, ok = grading.logs_eval(log_text, log_parsers.parse_pytest)
    report = grading.eval_tests_report(statuses, fail_to_pass, pass_to_pass)
    grading.resolution_status(report)  # ResolvedStatus.FULL

May import: ``aenv_ray``'s public API (errors, datasource).
"""

from __future__ import annotations

__all__: list[str] = []
