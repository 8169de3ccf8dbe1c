"""``aenv rollout ENV``: batch trajectory synthesis (tasks x policy -> JSONL and Parquet).

A rich progress bar with live throughput and failure counts while it runs, a summary table at
the end; the exit code is 1 when an episode of this run did not end ``ok``. The work itself is
:func:`rollout.synthesis.synthesize` (imported when the command runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from aenv_cli._common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, die, pairs
from aenv_ray.engine import check_engine_name

if TYPE_CHECKING:  # rich is imported when the command runs: every other command starts without
    from rich.console import Console
    from rich.table import Table

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``aenv rollout`` to ``app``."""
    app.command("rollout")(rollout_command)


def rollout_command(
    env: Annotated[str, typer.Argument(help="environment NAME[@VERSION]")],
    episodes: Annotated[int, typer.Option("--episodes", "-n", min=0, help="episodes to run")] = 8,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="episodes at a time")
    ] = 4,
    out: Annotated[Path, typer.Option("--out", "-o", help="output directory")] = Path("rollouts"),
    tasks: Annotated[
        Path | None, typer.Option("--tasks", help="tasks as JSON lines (default: the demo tasks)")
    ] = None,
    policy: Annotated[
        str | None, typer.Option("--policy", help="MODULE:CALLABLE, an async policy")
    ] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="an OpenAI-compatible endpoint")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="the model at --base-url")] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="key for --base-url")
    ] = None,
    max_turns: Annotated[
        int,
        typer.Option(min=1, help="model turns per episode; an episode cut there is `truncated`"),
    ] = 20,
    model_retries: Annotated[
        int,
        typer.Option(
            min=0,
            help="retries of a --base-url request that got no answer, 5xx or 429 (0.5 s, 1 s, "
            "2 s, ... apart)",
        ),
    ] = 5,
    endpoint_failures: Annotated[
        int,
        typer.Option(
            min=0,
            help="stop the run after this many episodes in a row lost to the same failure of "
            "the model endpoint (0: never)",
        ),
    ] = 3,
    system_prompt: Annotated[
        str | None,
        typer.Option(
            "--system-prompt",
            help="the system message (sent to --model; opens a --policy's recorded conversation)",
        ),
    ] = None,
    temperature: Annotated[
        float | None, typer.Option(min=0.0, help="the sampling temperature of --model")
    ] = None,
    logprobs: Annotated[
        bool, typer.Option("--logprobs", help="ask --model for its tokens' log-probabilities")
    ] = False,
    token_ids: Annotated[
        bool,
        typer.Option(
            "--token-ids",
            help="ask --model for the token ids of each prompt and reply (return_token_ids: "
            "vLLM, SGLang)",
        ),
    ] = False,
    retries: Annotated[
        int,
        typer.Option(
            min=0, help="retries of an episode after a retryable failure (docs/errors.md#retries)"
        ),
    ] = 2,
    episode_timeout: Annotated[
        float, typer.Option(min=0.001, help="seconds an episode may take")
    ] = 600.0,
    retry_failed: Annotated[
        bool, typer.Option(help="rerun episodes an earlier run recorded as failed")
    ] = False,
    env_var: Annotated[
        list[str] | None,
        typer.Option(
            "--env",
            "-e",
            help="KEY=VALUE in every instance's environment, repeatable; a bare KEY copies it "
            "from this environment (keys stay off the command line)",
        ),
    ] = None,
    datasource: Annotated[
        str | None,
        typer.Option(
            "--datasource",
            help="a directory mounted read-only at /data in every instance: your own "
            "Terminal-Bench or SWE dataset (a built-in then reads its tasks from it unless "
            "--tasks is given); on a hub, a directory under its --datasource-root",
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help="the engine of the Ray pool's instances: local, daemon, kubernetes or another "
            "installed engine (default: AENV_ENGINE, else local)"
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="write into OUT even when it holds another run's records"),
    ] = False,
    use_ray: Annotated[
        bool,
        typer.Option(
            "--ray/--no-ray",
            help="lease warm instances from a Ray pool (a local Ray unless one is running), "
            "or create one instance per episode in this process",
        ),
    ] = True,
    to_hub: Annotated[
        bool,
        typer.Option(
            "--to-hub/--not-to-hub",
            help="when the run uses the configured hub, mirror its records there while it "
            "runs (the hub's UI lists it, live, for your key's tenant)",
        ),
    ] = True,
) -> int:
    """Run ENV's episodes in parallel and write every trajectory to OUT (resumable)."""
    started = time.perf_counter()  # the summary's wall time: the whole command
    try:
        return _rollout(
            started,
            env,
            episodes=episodes,
            concurrency=concurrency,
            out=out,
            tasks=tasks,
            policy=policy,
            base_url=base_url,
            model=model,
            api_key=api_key,
            max_turns=max_turns,
            model_retries=model_retries,
            endpoint_failures=endpoint_failures,
            system_prompt=system_prompt,
            temperature=temperature,
            logprobs=logprobs,
            token_ids=token_ids,
            retries=retries,
            episode_timeout=episode_timeout,
            retry_failed=retry_failed,
            env_var=env_var,
            datasource=datasource,
            engine=engine,
            force=force,
            use_ray=use_ray,
            to_hub=to_hub,
        )
    except KeyboardInterrupt:
        _interrupted(out, episodes)
        raise typer.Exit(EXIT_INTERRUPTED) from None


EXIT_INTERRUPTED = 130


def _interrupted(out: Path, episodes: int) -> None:
    """The line a Ctrl-C leaves: what is written, and the command that goes on from there."""
    from rollout.run_directory import JSONL, read_records

    jsonl = out / JSONL
    try:
        records = read_records(jsonl)[0] if jsonl.is_file() else {}
    except Exception:  # a torn line: the rerun deals with it, and says so
        records = {}
    ok = sum(1 for r in records.values() if r.get("outcome") == "ok")
    failed = len(records) - ok
    parquet = " and trajectories.parquet" if (out / "trajectories.parquet").is_file() else ""
    also = f"; --retry-failed reruns the {failed} failed too" if failed else ""
    print(
        f"aenv: interrupted: {len(records)} of {episodes} episodes are recorded in "
        f"{jsonl}{parquet}; to resume, run the same command again (recorded episodes are "
        f"skipped{also}): {_same_command()}",
        file=sys.stderr,
        flush=True,
    )


def _same_command() -> str:
    """This ``aenv rollout`` command line as typed (an ``--api-key`` value hidden)."""
    import shlex

    args = sys.argv[1:]
    if args[:1] != ["rollout"]:
        return "aenv rollout ... (the same options)"
    shown: list[str] = []
    hide = False
    for arg in args:
        if hide:
            shown.append("$OPENAI_API_KEY")
        elif arg.startswith("--api-key="):
            shown.append("--api-key=$OPENAI_API_KEY")
        else:
            shown.append(shlex.quote(arg))
        hide = arg == "--api-key"
    return " ".join(["aenv", *shown])


def _rollout(
    started: float,
    env: str,
    *,
    episodes: int,
    concurrency: int,
    out: Path,
    tasks: Path | None,
    policy: str | None,
    base_url: str | None,
    model: str | None,
    api_key: str | None,
    max_turns: int,
    model_retries: int,
    endpoint_failures: int,
    system_prompt: str | None,
    temperature: float | None,
    logprobs: bool,
    token_ids: bool,
    retries: int,
    episode_timeout: float,
    retry_failed: bool,
    env_var: list[str] | None,
    datasource: str | None,
    engine: str | None,
    force: bool,
    use_ray: bool,
    to_hub: bool = True,
) -> int:
    from rollout.run_directory import RunDirectory  # light: the lock comes before Ray's import

    if policy is not None and base_url is not None:
        die("give --policy or --base-url, not both", EXIT_USAGE)
    if base_url is not None and model is None:
        die("--base-url needs --model", EXIT_USAGE)
    if base_url is None and (temperature is not None or logprobs or token_ids):
        die(
            "--temperature, --logprobs and --token-ids are settings of --base-url/--model",
            EXIT_USAGE,
        )
    if engine is not None:
        check_engine_name(engine)  # a ConfigurationError: exit 2
    variables = pairs(env_var or [], "--env", from_environment=True)
    site = _site(engine)
    host_data, mounted = _datasource(datasource, site)
    from rich.console import Console

    console = Console(stderr=True)
    with contextlib.ExitStack() as stack:
        # first of all: a second driver on OUT exits 2 here, before anything starts
        run = stack.enter_context(RunDirectory.open(out))
        from rollout.synthesis import (
            OpenAIPolicy,
            check_data,
            check_demo,
            demo_dialogue,
            load_tasks,
            pending_episodes,
            require_demo,
            synthesize,
        )

        # what is not given comes from a built-in's demo: say which options else (exit 2)
        require_demo(env, tasks=tasks is None, policy=policy is None and base_url is None)

        # what can be checked is checked before Ray or any instance starts (one line, exit 2)
        chosen: Any = policy
        if base_url is not None:
            assert model is not None
            chosen = OpenAIPolicy(
                base_url,
                model,
                api_key=api_key,
                max_turns=max_turns,
                temperature=temperature,
                system_prompt=system_prompt,
                logprobs=logprobs,
                token_ids=token_ids,
                dialogue=demo_dialogue(env),  # a built-in whose user is simulated (tau2)
                retries=model_retries,
            )
        elif policy is not None:
            from rollout.precheck import import_policy

            import_policy(policy)  # synthesize finds it imported
        task_list = load_tasks(tasks, env, datasource=host_data)
        if site != "kubernetes":  # (a pod's image may hold what a variable names)
            # the data is where the instances look: a directory they cannot see stops it here
            check_data(env, task_list, variables, host_data, given=mounted or None)
        if policy is None and base_url is None:
            check_demo(env, variables)  # a demo that needs settings (a model) says which
        identity = _identity(env, tasks, policy, base_url, model, variables, mounted)
        run.check_identity(identity, force=force)
        todo = pending_episodes(task_list, episodes, run.records, retry_failed=retry_failed)
        if run.torn is not None:
            console.print(f"[yellow]{run.torn.describe()}")
        if todo:
            _check_environment(console, env, task_list, tasks, engine)
        # a pool only for the episodes left (none left: no Ray at all)
        size = min(concurrency, len(todo))
        source: Any = None
        if use_ray and size:
            source = _ray_source(stack, console, env, size, engine, variables, mounted)
        elif (engine is not None or variables or mounted) and size:
            from rollout.sources import SDKSource

            source = SDKSource(
                env, engine=engine, environment_variables=variables, datasource=mounted
            )
        if to_hub and site == "hub":
            _mirror_to_hub(stack, console, run)
        display = _Display(console, env, episodes)
        with _policy_traceback(), display.progress:
            summary = asyncio.run(
                synthesize(
                    env,
                    episodes=episodes,
                    concurrency=concurrency,
                    out=run,
                    tasks=task_list,
                    policy=chosen,
                    source=source,
                    max_retries=retries,
                    episode_timeout=episode_timeout,
                    retry_failed=retry_failed,
                    on_episode=display.episode_done,
                    on_skip=display.skipped,
                    system_prompt=system_prompt,
                    endpoint_failures=endpoint_failures,
                )
            )
    console.print(_summary_table(summary, env, time.perf_counter() - started))
    console.print(f"trajectories: {summary.out / 'trajectories.jsonl'} and .parquet")
    return EXIT_OK if summary.ok else EXIT_FAILURE


def _mirror_to_hub(stack: contextlib.ExitStack, console: Console, run: Any) -> None:
    """Mirror ``run`` (a :class:`rollout.run_directory.RunDirectory`) to the configured hub
    while it runs (:class:`rollout.hub_report.HubReporter`), and say where to watch it."""
    from dataclasses import asdict

    from aenv_ray.settings import get_settings
    from rollout.hub_report import HubReporter

    settings = get_settings()
    assert settings.system_url is not None

    def warn(message: str) -> None:
        console.print(f"[yellow]aenv: {message}")

    holder = run.holder
    reporter = HubReporter(
        run.path,
        settings.system_url,
        settings.api_key,
        driver=asdict(holder) if holder is not None else None,
        warn=warn,
    )
    run_id = reporter.start()
    stack.callback(reporter.close)
    if run_id is not None:
        url = settings.system_url.rstrip("/")
        console.print(f"this run on the hub: {url}/ui/#/run/{run_id} (GET {url}/v1/runs/{run_id})")


def _site(engine: str | None) -> str:
    """Where the instances run: ``"hub"`` (the configured hub, unless ``--engine`` names an
    engine), ``"kubernetes"``, or ``"here"`` (an engine of this machine)."""
    from aenv_ray.settings import get_settings

    settings = get_settings()
    chosen = engine or (None if settings.system_url else settings.engine)
    return "hub" if chosen is None else "kubernetes" if chosen == "kubernetes" else "here"


def _datasource(given: str | None, site: str) -> tuple[Path | None, str]:
    """``(the directory on this machine, what the instances mount)`` of ``--datasource``: an
    existing directory, made absolute, for an engine of this machine; as given for a hub (a
    directory under its root, which this machine cannot look at: ``(None, given)``) and for
    Kubernetes (the datasource container's image)."""
    if not given:
        return None, ""
    if site != "here":
        return None, given
    path = Path(given).expanduser().resolve()
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        die(f"--datasource {given}: {what} on this machine ({path})", EXIT_USAGE)
    return path, str(path)


def _check_environment(
    console: Console,
    env: str,
    task_list: list[dict[str, Any]],
    tasks: Path | None,
    engine: str | None,
) -> None:
    """The environment resolves as the run will resolve it (through the configured hub, unless
    ``--engine`` names one) and takes what the tasks give its reward and setup functions."""
    from aenv_ray.settings import get_settings
    from rollout.precheck import check_tasks, environment_calls

    settings = get_settings()
    hub_url = settings.system_url if engine is None else None
    if engine == "local" or (engine is None and not hub_url and settings.engine == "local"):
        from local_backend import host_warnings

        host_warnings()  # here, once: a Ray pool's engines warn only into Ray's logs
    with console.status(f"checking {env} and its tasks"):
        calls = asyncio.run(
            environment_calls(env, task_list, hub_url=hub_url, api_key=settings.api_key)
        )
    if calls is not None:
        check_tasks(task_list, calls, source=str(tasks) if tasks else f"the demo tasks of {env}")


def _identity(
    env: str,
    tasks: Path | None,
    policy: str | None,
    base_url: str | None,
    model: str | None,
    variables: dict[str, str],
    datasource: str = "",
) -> dict[str, str]:
    """What makes a run this run: its environment and the instances' variables (by digest:
    they may hold keys), tasks (the file's content, wherever it lies), policy and datasource
    (only when given: runs recorded before ``--datasource`` keep their identity)."""
    import hashlib

    def digest(data: bytes) -> str:
        return f"sha256:{hashlib.sha256(data).hexdigest()[:16]}"

    content = digest(tasks.read_bytes()) if tasks else "demo"
    who = f"{base_url} model {model}" if base_url is not None else policy or "the demo policy"
    given = "\0".join(f"{k}={v}" for k, v in sorted(variables.items()))
    identity = {
        "env": env,
        "variables": digest(given.encode()) if variables else "none",
        "tasks": content,
        "policy": who,
    }
    if datasource:
        identity["datasource"] = datasource
    return identity


@contextlib.contextmanager
def _policy_traceback() -> Iterator[None]:
    """A programming error of the policy leaves its traceback (the policy's frames) on stderr
    before the one-line error the CLI prints for it."""
    from rollout.failures import PolicyCodeError

    try:
        yield
    except PolicyCodeError as exc:
        print(exc.details, end="", file=sys.stderr, flush=True)
        raise


def _ray_source(
    stack: contextlib.ExitStack,
    console: Console,
    env: str,
    size: int,
    engine: str | None,
    variables: dict[str, str],
    datasource: str,
) -> Any:
    """A warm :class:`rollout.RolloutPool` of ``size`` instances on ``engine`` (None: the
    ``AENV_ENGINE`` setting) with ``variables`` in their environment and ``datasource`` at
    ``/data``, closed with ``stack``."""
    from rollout import RolloutPool, init_local
    from rollout.failures import RayStartError
    from rollout.sources import PoolSource

    try:
        with console.status("starting Ray"):
            init_local()
    except RayStartError as exc:
        die(
            f"{exc}; run without Ray: --no-ray (one instance per episode in this process), or "
            "join a Ray that runs: RAY_ADDRESS=HOST:PORT (`ray start --head` starts one)"
        )
    with console.status(f"starting a Ray pool of {size} warm {env} instances"):
        where: dict[str, Any] = {"project": env} if "/" in env else {"env_name": env}
        pool = RolloutPool(
            size=size,
            engine=engine,
            environment_variables=variables,
            datasource=datasource,
            **where,
        )
    stack.callback(pool.close)
    return PoolSource(pool)


class _Display:
    """The progress bar: episodes done, episodes/s, tool calls/s, failures so far."""

    def __init__(self, console: Console, env: str, episodes: int) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("[red]{task.fields[failed]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task = self.progress.add_task(f"{env} episodes", total=episodes, rate="", failed="")
        self.started = time.perf_counter()
        self.done = 0
        self.calls = 0
        self.failed: dict[str, int] = {}

    def skipped(self, count: int) -> None:
        if count:
            self.progress.update(self.task, advance=count, description="episodes (resumed)")

    def episode_done(self, trajectory: Any) -> None:
        self.done += 1
        self.calls += len(trajectory.steps)
        if trajectory.outcome != "ok":
            self.failed[trajectory.outcome] = self.failed.get(trajectory.outcome, 0) + 1
        elapsed = max(1e-9, time.perf_counter() - self.started)
        rate = f"{self.done / elapsed:.1f} ep/s, {self.calls / elapsed:.0f} calls/s"
        failed = ", ".join(f"{k} {v}" for k, v in sorted(self.failed.items()))
        self.progress.update(self.task, advance=1, rate=rate, failed=failed)


def _summary_table(summary: Any, env: str, wall: float) -> Table:
    """The end of a run in a table; ``wall``: the whole command's seconds."""
    from rich.table import Table

    table = Table(title=f"aenv rollout {env}: {summary.out}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    run = sum(summary.outcomes.values())
    table.add_row("episodes (this run / skipped)", f"{run} / {summary.skipped}")
    if summary.torn is not None:
        torn = summary.torn.episode_id or "id cut off"
        table.add_row("torn last line dropped (rerun)", torn)
    for outcome, count in sorted(summary.outcomes.items()):
        table.add_row(f"  {outcome}", str(count))
    if summary.truncated:
        table.add_row("  of them truncated (--max-turns)", str(summary.truncated))
    table.add_row("retried on a fresh instance", str(summary.retries))
    table.add_row("tool calls", str(summary.tool_calls))
    table.add_row(f"mean reward ({summary.scored} of {run} scored)", _number(summary.mean_reward))
    table.add_row(
        f"mean reward, failed as 0 ({summary.counted} of {run})",
        _number(summary.mean_reward_with_failures),
    )
    seconds = max(summary.seconds, 1e-9)
    table.add_row("wall time (the whole command)", f"{wall:.1f} s")
    table.add_row("  of it running episodes", f"{summary.seconds:.1f} s")
    table.add_row("episodes/s (running)", f"{run / seconds:.2f}")
    table.add_row("tool calls/s (running)", f"{summary.tool_calls / seconds:.1f}")
    return table


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
