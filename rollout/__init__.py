"""rollout: Ray pools of warm instances, futures, batched stepping, gymnasium, batch jobs.

Will own: ``InstancePool`` actors and the driver-side ``RolloutPool`` whose calls return Ray
``ObjectRef``s, first-K-ready batched stepping, gymnasium ``Env``/``VectorEnv`` wrappers, batch
trajectory synthesis (``aenv rollout``) and the AReaL and RLlib adapters (not built yet).

May import: ``aenv_ray``, ray, gymnasium. Must not import: kubernetes (engines are injected).
"""

__all__: list[str] = []
