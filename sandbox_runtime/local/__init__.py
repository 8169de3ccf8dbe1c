"""sandbox_runtime.local: the local engine, instances of environments on this machine.

Owns :class:`LocalEngine` (the embedded default :class:`~aenv_ray.engine.SandboxEngine`), the
zygote that forks instances from a warm template, the namespace and mount recipe of an isolated
instance, per-instance cgroups, and the instances' compiled pid 1 (``init.c``).

May import: ``aenv_ray`` (engine contract, config, errors), ``sandbox_runtime``, platformdirs
(where the compiled init is cached); Linux system calls through ctypes. Must not import: ray,
kubernetes, envhub, rollout.
"""

from sandbox_runtime.local.engine import Isolation, LocalEngine

__all__ = ["Isolation", "LocalEngine"]
