"""tau2's domains, one package each; :func:`builtin_envs.tau2.domain.get_domain` imports them."""
