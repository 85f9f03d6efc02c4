"""Vertical (feature-partitioned) FL: parties hold columns, the server holds the labels and a head model.

- :mod:`trustfl.vertical.activation`: which party the server updates at each iteration (shuffled rounds,
  uniform, or a virtual clock over the asynchronous engine's speed models).
- :mod:`trustfl.vertical.directions`: seeded random directions regenerated in place (the MeZO memory trick).
- :mod:`trustfl.vertical.parties` / :mod:`trustfl.vertical.server`: what a party and the server each hold and do.
- :mod:`trustfl.vertical.methods`: one server iteration of DPZV and of the baselines VAFL, ZOO-VFL, VFL-CZOFO.
- :mod:`trustfl.vertical.engine`: the ``vertical`` engine (registered as ``("engine", "vertical")``).
"""
