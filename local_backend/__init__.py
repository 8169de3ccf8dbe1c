"""local_backend: the local engine, instances of environments on this machine.

The host side of the embedded default engine, beside ``k8s_backend`` (the scale-out engine):
what runs inside an instance is ``sandbox_runtime``; this package starts, isolates, limits and
ends the processes that run it. The direction is engine -> runtime -> SDK, never back.

Owns :class:`LocalEngine` (the embedded default :class:`~aenv_ray.engine.SandboxEngine`), the
zygote that forks instances from a warm template (and the launcher that forks an engine's later
zygotes warm), the namespace and mount recipe of an isolated
instance, per-instance cgroups, and the instances' compiled pid 1 (``init.c``).

May import: ``aenv_ray`` (engine contract, config, errors), ``sandbox_runtime``, platformdirs
(where the compiled init is cached), aiohttp (the daemon's HTTP on its Unix socket, and its
client); lazily, inside functions: ``builtin_envs`` (its tree is bind-mounted into instances,
and a built-in's host data: ``builtin_envs.host_data``).
Linux system calls go through ctypes. Must not import: ray, kubernetes, envhub, rollout.
"""

from local_backend.engine import Isolation, LocalEngine, host_warnings

__all__ = ["Isolation", "LocalEngine", "host_warnings"]
